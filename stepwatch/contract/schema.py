"""The contract as JSON Schema, generated from the msgspec structs.

``python -m stepwatch.contract.schema > events.schema.json`` gives a schema
other languages' producers can validate against. The structs stay the source
of truth; this is a view of them.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import msgspec

from stepwatch.contract.records import Message


def json_schema() -> dict[str, Any]:
    return msgspec.json.schema(Message)


def main() -> int:
    json.dump(json_schema(), sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
