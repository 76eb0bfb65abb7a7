"""The worker's per-message shortcuts give what stock Faust gives; the GC tuning applies."""

from __future__ import annotations

import asyncio
import gc
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from faust.transport.producer import ProducerBuffer

from stepwatch.settings import Settings
from stepwatch.streams.worker.app import StreamOptions, create_app, tune_gc
from stepwatch.streams.worker.transport import LeanProducerBuffer, RawSchema

pytestmark = pytest.mark.unit


def test_tune_gc_freezes_what_exists_and_raises_the_young_threshold() -> None:
    saved = gc.get_threshold()
    try:
        tune_gc(12_345)
        assert gc.get_threshold() == (12_345, saved[1], saved[2])
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*saved)


@pytest.mark.parametrize("threaded", [False, True])
def test_lean_buffer_size_is_upstreams(threaded: bool) -> None:
    async def sizes() -> tuple[int, int]:
        buf = LeanProducerBuffer()
        buf.app = SimpleNamespace(conf=SimpleNamespace(producer_threaded=threaded))  # type: ignore[assignment]
        buf.threaded = threaded
        if threaded:
            buf.queue = asyncio.Queue()
            for i in range(3):
                buf.queue.put_nowait(i)
        else:
            for i in range(5):
                buf.pending.put_nowait(i)  # type: ignore[arg-type]
        upstream = ProducerBuffer.size.fget(buf)  # type: ignore[attr-defined]
        return buf.size, upstream

    lean, upstream = asyncio.run(sizes())
    assert lean == upstream == (3 if threaded else 5)


@dataclass
class Msg:
    key: bytes | None = b"job-1"
    value: bytes | None = b'{"kind":"step"}'
    headers: list[tuple[str, bytes]] = field(default_factory=lambda: [("h", b"1")])


def test_raw_schema_event_and_lean_producer_match_the_app(tmp_path: Any) -> None:
    settings = Settings.load(env={}, bootstrap_servers="127.0.0.1:9", stream_data_dir=str(tmp_path))
    app = create_app(settings, StreamOptions(data_dir=str(tmp_path))).app
    msg = Msg()
    decode = RawSchema(key_type=bytes, value_type=bytes).compile(app)
    event = asyncio.run(decode(msg))
    stock = app.create_event(msg.key, msg.value, msg.headers, msg)
    assert type(event) is type(stock)
    assert (event.key, event.value, event.headers, event.message) == (
        stock.key,
        stock.value,
        stock.headers,
        stock.message,
    )
    buf = app.producer.buffer
    assert isinstance(buf, LeanProducerBuffer)
    assert buf.threaded is bool(app.conf.producer_threaded)
