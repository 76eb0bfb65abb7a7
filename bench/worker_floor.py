"""``stepwatch stream`` with part of its hot path switched off: the floors under its rate.

``python bench/worker_floor.py MODE [stepwatch options] stream ...`` runs the
same worker as ``python -m stepwatch.cli`` (the same Faust app, lean consumer,
metrics and offsets), with one part replaced before it starts:

* ``core-off``: every partition's detection core is a no-op (``NullEngine``);
  decoding, admission, duplicates, metrics and the Kafka/Faust layer run as
  usual. Its rate is what the worker would do if detection cost nothing.
* ``layer``: the processor only counts each batch's messages and records
  their offsets (no decoding at all): the Kafka/Faust layer alone (aiokafka's
  fetch, Faust's hand-off, acks and commits).

``bench/bench_stream.py --floors`` runs both next to the real worker. A
benchmark aid only: nothing here is installed or used by the product.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

MODES = ("core-off", "layer")


class NullEngine:
    """An :class:`~stepwatch.streams.core.api.Analyzer` that keeps nothing and finds
    nothing."""

    def process(self, message: Any, arrived: float | None = None) -> list[Any]:
        return []

    def tick(self, now: float) -> list[Any]:
        return []

    def forget(self, job_id: str, now: float, why: str) -> list[Any]:
        return []

    def forget_host(self, host: str) -> None:
        return None

    def stats(self) -> list[Any]:
        return []

    def health(self) -> dict[str, int]:
        return {}


def count_only(self: Any, records: Sequence[Any]) -> list[Any]:
    """``StreamProcessor.process_batch`` without decoding: offsets and message counts
    only (events are counted by the benchmark, which knows what it produced)."""
    messages: dict[str, int] = {}
    for rec in records:
        self.positions[(rec.topic, rec.partition)] = rec.offset
        kind = self.kind_of_topic.get(rec.topic, "unknown")
        messages[kind] = messages.get(kind, 0) + 1
    self._flush_tally({("messages", kind): n for kind, n in messages.items()})
    return []


def install(mode: str) -> None:
    """Replace the part ``mode`` switches off (before the app is built)."""
    from stepwatch.streams.worker import app, processor

    if mode not in MODES:
        raise SystemExit(f"worker_floor: mode must be one of {MODES}, got {mode!r}")
    app.default_engine_factory = lambda settings: NullEngine
    if mode == "layer":
        processor.StreamProcessor.process_batch = count_only  # type: ignore[method-assign]


def main(argv: list[str]) -> int:
    if not argv:
        raise SystemExit(f"usage: worker_floor.py {{{','.join(MODES)}}} [stepwatch args]")
    install(argv[0])
    from stepwatch.cli import main as cli_main

    return cli_main(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
