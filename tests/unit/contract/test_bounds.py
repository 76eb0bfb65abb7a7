"""One set of value bounds and one size limit, applied alike by the stream worker and the sink."""

from __future__ import annotations

import pytest

from stepwatch.contract import Topics, decode
from stepwatch.errors import ContractError
from stepwatch.exporters.clickhouse.prepare import Preparer
from stepwatch.exporters.clickhouse.prepare import Record as SinkRecord
from stepwatch.streams.worker.dlq import decode_dead_letter
from stepwatch.streams.worker.processor import Record, StreamProcessor

TOPICS = Topics("t")
T0 = 1_700_000_000.0
STEP = (
    '{"kind":"step","host":"h","ts":%f,"inst":"i","seq":%d,"job_id":"j","steps":'
    '[{"job_id":"j","rank":0,"world_size":8,"step":1,"start":%f,"end":%f,"samples":%s}]}'
)
GPU = '{"kind":"gpu","host":"h","ts":%f,"inst":"i","seq":%d,"gpus":[{"index":0,%s}]}'
PORT = '{"kind":"port","host":"h","ts":%f,"inst":"i","seq":%d,"ports":[{"device":"m","port":1,%s}]}'
EVENT = '{"kind":"event","host":"h","ts":%f,"inst":"i","seq":%d,"type":"xid","code":%s}'

_MORE_GPUS = "".join(f',{{"index":{i}}}' for i in range(1, 257))  # 257 in all
_MORE_PORTS = "".join(f',{{"device":"m{i}","port":1}}' for i in range(1, 257))
_EVERY_GPU = ",".join(f'{{"index":{i}}}' for i in range(256))
_ALL_GPUS = f'{{"kind":"gpu","host":"h","ts":{T0},"inst":"i","seq":18,"gpus":[{_EVERY_GPU}]}}'

# (topic, payload) -> the reason both consumers must give
BAD: list[tuple[str, bytes, str]] = [
    (TOPICS.steps, (STEP % (T0, 0, T0, T0 + 1, str(2**64))).encode(), "overflow"),
    (TOPICS.steps, (STEP % (T0, 1, T0, T0 + 1, "1" * 30)).encode(), "overflow"),
    (TOPICS.gpu, (GPU % (T0, 2, '"power_w":1e300')).encode(), "overflow"),
    (TOPICS.gpu, (GPU % (T0, 3, f'"energy_mj_total":{2**70}')).encode(), "overflow"),
    (TOPICS.gpu, (GPU % (T0, 4, f'"xid_last":{2**40}')).encode(), "overflow"),
    # its increases are summed per GPU and minute in UInt64: 2^63 twice wrapped to few
    (TOPICS.gpu, (GPU % (T0, 24, f'"ecc_dbe_total":{2**63 - 1}')).encode(), "overflow"),
    (TOPICS.gpu, (GPU % (T0, 25, f'"pcie_replay_total":{2**63 - 1}')).encode(), "overflow"),
    (
        TOPICS.gpu,
        (GPU % (T0, 26, f'"remapped_rows_uncorrectable":{2**63 - 1}')).encode(),
        "overflow",
    ),
    (TOPICS.ports, (PORT % (T0, 5, f'"xmit_bytes_total":{2**65}')).encode(), "overflow"),
    (TOPICS.events, (EVENT % (T0, 6, str(2**64))).encode(), "overflow"),
    (TOPICS.events, (EVENT % (T0, 7, "1e300")).encode(), "schema"),  # a float is no XID code
    (TOPICS.gpu, (GPU % (T0, 8, '"power_w":1e999')).encode(), "overflow"),
    (TOPICS.gpu, (GPU % (T0, 9, '"power_w":-1')).encode(), "absurd_value"),
    # phases of 3e38 s each fitted their Float32 columns, but not their sum (compute_s):
    # the sink refused the step the worker counted; a phase lasts a week at most, as a step
    (
        TOPICS.steps,
        (STEP % (T0, 19, T0, T0 + 1, "1"))
        .replace('"samples":1', '"samples":1,"phases":{"forward":3e38,"backward":3e38}')
        .encode(),
        "overflow",
    ),
    # one rank's step counted up to 2^63 - 1 tokens: two such summed in the store's UInt64
    # per-minute rollup wrapped the job's minute to a small number
    (TOPICS.steps, (STEP % (T0, 21, T0, T0 + 1, str(2**40 + 1))).encode(), "overflow"),
    (
        TOPICS.steps,
        (STEP % (T0, 22, T0, T0 + 1, "1")).replace('"samples":1', f'"tokens":{2**63 - 1}').encode(),
        "overflow",
    ),
    (
        TOPICS.steps,
        (STEP % (T0, 23, T0, T0 + 1, "1")).replace('"samples":1', '"flops":1e300').encode(),
        "overflow",
    ),
    (
        TOPICS.steps,
        (STEP % (T0, 20, T0, T0 + 1, "1"))
        .replace('"samples":1', '"samples":1,"phases":{"extra":{"zero_bubble":604801}}')
        .encode(),
        "overflow",
    ),
    (
        TOPICS.events,
        ((EVENT % (T0, 10, "79"))[:-1] + ',"junk":"%s"}' % ("x" * 2_000_000)).encode(),
        "too_large",
    ),
    # a string that is not UTF-8 (msgspec raises UnicodeDecodeError, not DecodeError): in
    # a name the header reads, in a record's name, in a field no reader keeps
    (
        TOPICS.gpu,
        (GPU % (T0, 13, '"power_w":1')).encode().replace(b'"h"', b'"h\xff"'),
        "malformed_json",
    ),
    (
        TOPICS.steps,
        (STEP % (T0, 14, T0, T0 + 1, "1")).encode().replace(b'"j"', b'"\xc3("'),
        "malformed_json",
    ),
    (
        TOPICS.gpu,
        (GPU % (T0, 15, '"power_w":1'))
        .encode()
        .replace(b'"index"', b'"uuid":"\xed\xa0\x80","index"'),
        "malformed_json",
    ),
    # more devices than any host has (MAX_DEVICES, 256): one message made a consumer hold
    # thousands of ports (their names kept for good in the worker)
    (TOPICS.gpu, ((GPU % (T0, 16, '"power_w":1'))[:-2] + _MORE_GPUS + "]}").encode(), "schema"),
    (
        TOPICS.ports,
        ((PORT % (T0, 17, '"state":"ACTIVE"'))[:-2] + _MORE_PORTS + "]}").encode(),
        "schema",
    ),
]
GOOD = [
    (TOPICS.gpu, (GPU % (T0, 11, f'"power_w":300.5,"energy_mj_total":{2**62}')).encode()),
    (TOPICS.events, (EVENT % (T0, 12, "79")).encode()),
]


def worker_reasons(max_bytes: int = 1 << 20) -> tuple[dict[int, str], int]:
    proc = StreamProcessor(
        TOPICS, _NoEngine, worker="w", clock=lambda: T0 + 10, max_message_bytes=max_bytes
    )
    records = [Record(t, 0, i, b"j", v) for i, (t, v, _) in enumerate(BAD)]
    records += [Record(t, 0, len(BAD) + i, b"j", v) for i, (t, v) in enumerate(GOOD)]
    out = proc.process_batch(records)
    letters = [decode_dead_letter(o.value) for o in out if o.topic == TOPICS.dlq]
    return {d.offset: d.reason for d in letters}, len(records) - len(letters)


def sink_reasons(max_bytes: int = 1 << 20) -> tuple[dict[int, str], int]:
    prep = Preparer(now=lambda: T0 + 10, max_message_bytes=max_bytes)
    records = [SinkRecord(t, 0, i, v) for i, (t, v, _) in enumerate(BAD)]
    records += [SinkRecord(t, 0, len(BAD) + i, v) for i, (t, v) in enumerate(GOOD)]
    out = prep.prepare(records)
    stored = sum(len(b.rows) for b in out.tables.values())
    return {row[3]: row[5] for row in out.dead}, stored


class _NoEngine:
    def process(self, message: object, arrived: float | None = None) -> list:
        return []

    def tick(self, now: float) -> list:
        return []

    def forget(self, job_id: str, now: float, why: str) -> list:
        return []

    def forget_host(self, host: str) -> None:
        pass

    def stats(self) -> list:
        return []


def test_worker_and_sink_reject_the_same_messages_for_the_same_reasons() -> None:
    expected = {i: reason for i, (_, _, reason) in enumerate(BAD)}
    worker, worker_ok = worker_reasons()
    sink, sink_ok = sink_reasons()
    assert worker == expected
    assert sink == expected
    assert worker_ok == sink_ok == len(GOOD)


def test_the_size_limit_is_configurable_for_both() -> None:
    small = 200
    worker, _ = worker_reasons(max_bytes=small)
    sink, _ = sink_reasons(max_bytes=small)
    big = {i for i, (_, v, _) in enumerate(BAD) if len(v) > small}
    assert {i for i, r in worker.items() if r == "too_large"} == big
    assert {i for i, r in sink.items() if r == "too_large"} == big


@pytest.mark.parametrize(("payload", "reason"), [(v, r) for _, v, r in BAD])
def test_decode_names_the_reason(payload: bytes, reason: str) -> None:
    with pytest.raises(ContractError) as info:
        decode(payload, now=lambda: T0 + 10)
    assert info.value.reason == reason


def test_as_many_devices_as_a_message_may_hold_pass() -> None:
    message = decode(_ALL_GPUS.encode(), now=lambda: T0 + 10)
    assert len(message.gpus) == 256  # type: ignore[union-attr]
