"""Detection quality of the core against ground truth: see :mod:`stepwatch.quality.run`.

python bench/detect_quality.py [--quick] [--seed 7] [--json out.json]
"""

from __future__ import annotations

import sys

from stepwatch.quality.run import main

if __name__ == "__main__":
    sys.exit(main())
