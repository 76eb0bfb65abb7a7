"""Records Kafka will never take, kept on the node: ``<spool_dir>/dead/``.

A record the broker (or librdkafka's own ``message.max.bytes`` check) refuses
for good — too large, invalid — must neither be retried forever nor block what
comes after it in the spool. The publisher hands it here and moves on. Each
dead letter is one JSON file: when, why, topic, key, size and the value (the
value's first ``max_bytes / 4`` bytes when larger, ``truncated: true``). The
directory is bounded by ``max_bytes``: the oldest files go first. Writing
never raises; a failure is counted and logged once.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import time
from collections import Counter, deque
from pathlib import Path

from stepwatch.agents.private import private_dir, write_file
from stepwatch.errors import SpoolError
from stepwatch.logs import LogOnce

log = logging.getLogger(__name__)

DIRNAME = "dead"


class DeadLetters:
    def __init__(self, spool_dir: str | os.PathLike[str], max_bytes: int) -> None:
        self.dir = Path(spool_dir) / DIRNAME
        self.max_bytes = max_bytes
        self.counts: Counter[str] = Counter()  # dead letters by reason
        self.write_errors = 0
        self.evicted = 0
        self._log = LogOnce(log)
        self._files: deque[tuple[Path, int]] = deque()
        self._bytes = 0
        self._n = 0
        for path in sorted(self.dir.glob("*.json")) if self.dir.is_dir() else []:
            try:
                size = path.stat().st_size
            except OSError:
                continue
            self._files.append((path, size))
            self._bytes += size

    def put(self, topic: str, key: bytes, value: bytes, reason: str) -> None:
        """Keep one refused record (bounded); never raises."""
        self.counts[reason] += 1
        log.error(
            "record dead-lettered, not retried reason=%s topic=%s bytes=%d dir=%s",
            reason,
            topic,
            len(value),
            self.dir,
        )
        keep = max(1024, self.max_bytes // 4)
        body = json.dumps(
            {
                "time": time.time(),
                "reason": reason,
                "topic": topic,
                "key": key.decode("utf-8", "replace"),
                "bytes": len(value),
                "truncated": len(value) > keep,
                "value_b64": base64.b64encode(value[:keep]).decode(),
            }
        ).encode()
        self._n += 1
        path = self.dir / f"{time.time_ns():020d}-{self._n:06d}.json"
        try:
            private_dir(self.dir, "dead-letter directory")
            write_file(path, body)
        except (OSError, SpoolError) as err:
            self.write_errors += 1
            self._log(
                "write",
                "cannot write dead letter dir=%s err=%r",
                self.dir,
                err,
                level=logging.ERROR,
            )
            return
        self._files.append((path, len(body)))
        self._bytes += len(body)
        self._evict()

    def _evict(self) -> None:
        while self._bytes > self.max_bytes and len(self._files) > 1:
            path, size = self._files.popleft()
            path.unlink(missing_ok=True)
            self._bytes -= size
            self.evicted += 1

    def total(self) -> int:
        return sum(self.counts.values())
