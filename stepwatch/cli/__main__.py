import sys

from stepwatch.cli import main

sys.exit(main())
