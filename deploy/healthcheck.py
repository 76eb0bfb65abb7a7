#!/usr/bin/env python3
"""Container health of a stepwatch service: its /metrics answers and its readiness gauge is 1.

    python deploy/healthcheck.py PORT GAUGE     # e.g. 9466 stepwatch_stream_ready

Used by docker-compose.yml healthchecks and the Kubernetes readiness probe (the image
installs it as /usr/local/bin/stepwatch-healthcheck). Standard library only; plain HTTP
on loopback (with /metrics TLS or basic auth, probe with httpGet instead: docs/deploy.md).
Exit 0: ready; 1: up but not ready, or not answering.
"""

from __future__ import annotations

import sys
import urllib.request


def ready(body: str, gauge: str) -> bool:
    """True when an unlabelled sample of ``gauge`` in the exposition ``body`` is >= 1."""
    for line in body.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == gauge:
            try:
                return float(parts[1]) >= 1
            except ValueError:
                return False
    return False


def main(argv: list[str]) -> int:
    if len(argv) != 2 or not argv[0].isdigit():
        print(__doc__, file=sys.stderr)
        return 2
    port, gauge = argv
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=3) as resp:
            body = resp.read().decode("utf-8", "replace")
    except OSError as err:
        print(f"not answering on {port}: {err}", file=sys.stderr)
        return 1
    if not ready(body, gauge):
        print(f"{gauge} is not 1", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
