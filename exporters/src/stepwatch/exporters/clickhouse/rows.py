"""Contract messages -> table rows, and the checks that keep bad values out.

Each :class:`Table` lists its columns with their ClickHouse types, in the order
of the DDL (a unit test compares them with ``system.columns`` after the
migrations ran). ClickHouse silently wraps an integer that overflows its column
(70000 into UInt16 is stored as 4464), so every row is checked against these
types before it is written; a row that does not fit goes to the dead-letter
table with the reason instead.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from stepwatch.contract import (
    DetectionMessage,
    EventMessage,
    GpuMessage,
    GpuReading,
    PortMessage,
    PortReading,
    StepMessage,
    StepRecord,
)
from stepwatch.exporters.clickhouse.rates import GPU_DELTAS, GPU_RATES, PORT_COUNTERS, PORT_RATES

Check = Callable[[Any], str | None]

_GPU_BASE = tuple(n for n in GpuReading.__struct_fields__ if n != "index")
_PORT_BASE = tuple(n for n in PortReading.__struct_fields__ if n not in ("device", "port"))


@dataclass(frozen=True)
class ColumnCheck:
    """Range check of one column: a fast whole-column test, then per value on failure."""

    index: int
    name: str
    check: Check
    bounds: tuple[float, float] | None  # (lo, hi) for numbers; None: check every value
    in_map: bool = False  # the values are those of a map column

    def values(self, rows: list[tuple[Any, ...]]) -> list[Any]:
        i = self.index
        if self.in_map:
            return [v for r in rows if r[i] for v in r[i].values()]
        return [r[i] for r in rows if r[i] is not None]

    def passes(self, rows: list[tuple[Any, ...]]) -> bool:
        if self.bounds is None:
            return False
        values = self.values(rows)
        if not values:
            return True
        try:
            total = sum(values)
            finite = math.isfinite(total)
        except (TypeError, OverflowError):
            return False
        lo, hi = self.bounds
        return finite and lo <= min(values) and max(values) <= hi

    def problem(self, row: tuple[Any, ...]) -> str | None:
        value = row[self.index]
        if value is None:
            return None
        if self.in_map:
            for key, item in value.items():
                found = self.check(item)
                if found:
                    return f"[{key!r}] {found}"
            return None
        return self.check(value)


@dataclass(frozen=True)
class Table:
    name: str
    columns: tuple[tuple[str, str], ...]
    checks: tuple[ColumnCheck, ...] = field(default=(), repr=False, compare=False)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.columns)

    def check(self, row: tuple[Any, ...]) -> str | None:
        """Why the row cannot be stored as is (None: it can)."""
        return self.check_rows([row]).get(0)

    def check_rows(self, rows: list[tuple[Any, ...]]) -> dict[int, str]:
        """Problems by row index; a whole column is checked at C speed first."""
        bad: dict[int, str] = {}
        width = len(self.columns)
        for i, row in enumerate(rows):
            if len(row) != width:
                bad[i] = f"{self.name}: {len(row)} values for {width} columns"
        for check in self.checks:
            if check.passes(rows):
                continue
            for i, row in enumerate(rows):
                if i in bad or len(row) != width:
                    continue
                problem = check.problem(row)
                if problem:
                    bad[i] = f"{self.name}.{check.name}: {problem}"
        return bad


def _int_check(lo: int, hi: int, type_name: str) -> Check:
    def check(v: Any) -> str | None:
        if not isinstance(v, int):
            return f"{v!r} is not an integer ({type_name})"
        if not lo <= v <= hi:
            return f"{v} overflows {type_name}"
        return None

    return check


FLOAT32_MAX = 3.4028234e38
DATETIME_MAX = 10413792000.0  # 2300-01-01


def _float32(v: Any) -> str | None:
    if not isinstance(v, int | float):
        return f"{v!r} is not a number (Float32)"
    if not math.isfinite(v):
        return f"{v!r} is not finite (Float32)"
    if abs(v) > FLOAT32_MAX:
        return f"{v!r} overflows Float32"
    return None


def _datetime(v: Any) -> str | None:
    if not isinstance(v, int | float) or not 0 < v < DATETIME_MAX:
        return f"{v!r} is not a timestamp DateTime64 can hold"
    return None


_INT = re.compile(r"^(U?)Int(8|16|32|64)$")


def compile_check(type_name: str) -> tuple[Check, tuple[float, float] | None, bool] | None:
    """(check, bounds, in_map) for one ClickHouse type; None: nothing can overflow it.

    Strings, Float64, Bool and Map(String, String) values always fit: the
    contract's types and the row builder guarantee them.
    """
    if type_name.startswith("Nullable(") and type_name.endswith(")"):
        return compile_check(type_name[len("Nullable(") : -1])
    match = _INT.match(type_name)
    if match:
        bits = int(match.group(2))
        lo, hi = (0, 2**bits - 1) if match.group(1) else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
        return _int_check(lo, hi, type_name), (lo, hi), False
    if type_name == "Float32":
        return _float32, (-FLOAT32_MAX, FLOAT32_MAX), False
    if type_name.startswith("DateTime64"):
        return _datetime, (1e-9, DATETIME_MAX - 1), False
    if type_name == "Map(LowCardinality(String), Float32)":
        return _float32, (-FLOAT32_MAX, FLOAT32_MAX), True
    return None


def table(name: str, columns: list[tuple[str, str]]) -> Table:
    checks = []
    for i, (col, type_name) in enumerate(columns):
        compiled = compile_check(type_name)
        if compiled is not None:
            check, bounds, in_map = compiled
            checks.append(ColumnCheck(i, col, check, bounds, in_map))
    return Table(name, tuple(columns), tuple(checks))


def _nf32(names: tuple[str, ...] | list[str]) -> list[tuple[str, str]]:
    return [(n, "Nullable(Float32)") for n in names]


def _nu64(names: tuple[str, ...] | list[str]) -> list[tuple[str, str]]:
    return [(n, "Nullable(UInt64)") for n in names]


_TAIL = [("inst", "LowCardinality(String)"), ("seq", "UInt64")]
_LC = "LowCardinality(String)"
_DT6 = "DateTime64(6, 'UTC')"
_DT3 = "DateTime64(3, 'UTC')"
_PHASES = (
    "data_s",
    "forward_s",
    "backward_s",
    "optimizer_s",
    "comm_wait_s",
    "checkpoint_s",
    "compute_s",
)

STEPS = table(
    "step_events",
    [
        ("job_id", _LC),
        ("step", "UInt64"),
        ("rank", "UInt32"),
        ("world_size", "UInt32"),
        ("host", _LC),
        ("local_rank", "UInt32"),
        ("gpu", "UInt16"),
        ("peer_group", _LC),
        ("start_ts", _DT6),
        ("end_ts", _DT6),
        ("duration_s", "Float32"),
        *_nf32(_PHASES),
        ("phases_extra", "Map(LowCardinality(String), Float32)"),
        ("samples", "UInt64"),
        ("tokens", "UInt64"),
        ("loss", "Nullable(Float64)"),
        ("flops", "Nullable(Float64)"),
        ("timing", _LC),
        ("cpu_time_s", "Nullable(Float32)"),
        ("cpu_wait_s", "Nullable(Float32)"),
        *_TAIL,
    ],
)

_GPU_TYPES = {
    "uuid": "String",
    "name": _LC,
    "pci_bus_id": "String",
    "throttle_reasons": "Nullable(UInt64)",
    "remapped_rows_pending": "Nullable(Bool)",
    "remapped_rows_failure": "Nullable(Bool)",
    "xid_last": "Nullable(UInt32)",
}
GPUS = table(
    "gpu_samples",
    [
        ("ts", _DT3),
        ("job_id", _LC),
        ("host", _LC),
        ("gpu", "UInt16"),
        *[
            (
                n,
                _GPU_TYPES.get(
                    n,
                    "Nullable(UInt64)"
                    if n.endswith(("_total", "rows_correctable", "rows_uncorrectable"))
                    else "Nullable(Float32)",
                ),
            )
            for n in _GPU_BASE
        ],
        ("dt_s", "Nullable(Float32)"),
        *_nu64([c for _, c in GPU_DELTAS]),
        *[(c, "Nullable(Float64)") for _, c in GPU_RATES],
        ("ver", "UInt8"),
        *_TAIL,
    ],
)

PORTS = table(
    "port_samples",
    [
        ("ts", _DT3),
        ("job_id", _LC),
        ("host", _LC),
        ("device", _LC),
        ("port", "UInt16"),
        ("netdev", _LC),
        ("link_layer", _LC),
        ("state", _LC),
        ("phys_state", _LC),
        ("rate_gbps", "Nullable(Float32)"),
        *_nu64(PORT_COUNTERS),
        ("dt_s", "Nullable(Float32)"),
        *[(c, "Nullable(Float64)") for c in PORT_RATES],
        ("ver", "UInt8"),
        *_TAIL,
    ],
)

EVENTS = table(
    "events",
    [
        ("ts", _DT3),
        ("job_id", _LC),
        ("host", _LC),
        ("type", _LC),
        ("rank", "Nullable(UInt32)"),
        ("gpu", "Nullable(UInt16)"),
        ("device", _LC),
        ("port", "Nullable(UInt16)"),
        ("code", "Nullable(Int64)"),
        ("detail", "String"),
        ("attrs", "Map(String, String)"),
        *_TAIL,
    ],
)

DETECTIONS = table(
    "detections",
    [
        ("ts", _DT3),
        ("id", "String"),
        ("job_id", _LC),
        ("type", _LC),
        ("state", _LC),
        ("rank", "Nullable(UInt32)"),
        ("gpu", "Nullable(UInt16)"),
        ("peer_group", _LC),
        ("cause", _LC),
        ("fault", _LC),
        ("score", "Nullable(Float64)"),
        ("step", "Nullable(UInt64)"),
        ("first_step", "Nullable(UInt64)"),
        ("opened_at", f"Nullable({_DT3})"),
        ("summary", "String"),
        ("evidence", "Map(String, String)"),
        ("subject_host", _LC),
        ("host", _LC),
        ("device", _LC),
        ("port", "Nullable(UInt16)"),
        ("ranks", "Array(UInt32)"),
        ("related", "String"),
        ("producer", _LC),
        *_TAIL,
    ],
)

DEAD_LETTERS = table(
    "dead_letters",
    [
        ("received_at", _DT3),
        ("topic", _LC),
        ("partition", "UInt32"),
        ("offset", "UInt64"),
        ("kafka_key", "String"),
        ("reason", _LC),
        ("detail", "String"),
        ("payload", "String"),
        ("kind", _LC),
        ("host", _LC),
        ("inst", _LC),
        ("seq", "Nullable(UInt64)"),
        ("payload_encoding", _LC),  # 'utf-8' or 'base64' (schema/0011)
        ("payload_truncated", "Bool"),
        ("payload_crc", "UInt32"),  # CRC-32 of the whole value, in the sort key (schema/0012)
    ],
)

# The sink's ledger of accepted sender numbers (schema/0010_sender_seqs.sql).
SENDER_SEQS = table(
    "sender_seqs",
    [
        ("key", "UInt64"),
        ("host", _LC),
        ("inst", _LC),
        ("kind", _LC),
        ("seq", "UInt64"),
        ("digest", "UInt64"),
        ("accepted_at", _DT3),
    ],
)

ALERTS = table(
    "alerts",
    [
        ("received_at", _DT3),
        ("fingerprint", "String"),
        ("alertname", _LC),
        ("status", _LC),
        ("severity", _LC),
        ("starts_at", _DT3),
        ("ends_at", f"Nullable({_DT3})"),
        ("job_id", _LC),
        ("host", _LC),
        ("labels", "Map(String, String)"),
        ("annotations", "Map(String, String)"),
    ],
)

REMEDIATIONS = table(
    "remediation_actions",
    [
        ("ts", _DT3),
        ("id", "String"),
        ("action", _LC),
        ("status", _LC),
        ("dry_run", "Bool"),
        ("job_id", _LC),
        ("host", _LC),
        ("detection_id", "String"),
        ("alert_fingerprint", "String"),
        ("reason", "String"),
        ("detail", "String"),
        ("actor", _LC),
        ("mode", _LC),
        ("alertname", _LC),
        ("cause", _LC),
        ("alert_class", _LC),
    ],
)

TABLES: dict[str, Table] = {
    t.name: t
    for t in (
        STEPS,
        GPUS,
        PORTS,
        EVENTS,
        DETECTIONS,
        DEAD_LETTERS,
        SENDER_SEQS,
        ALERTS,
        REMEDIATIONS,
    )
}


# --------------------------------------------------------------------------- values
def f64(value: float | None) -> float | str | None:
    """A Float64 value as JSON: NaN and infinities as the strings ClickHouse reads."""
    if value is None or math.isfinite(value):
        return value
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


def text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


# --------------------------------------------------------------------------- rows
def step_row(msg: StepMessage, rec: StepRecord) -> tuple[Any, ...]:
    p = rec.phases
    phases: tuple[float | None, ...] = (None,) * 6
    compute = None
    extra: dict[str, float] = {}
    if p is not None:
        phases = (p.data, p.forward, p.backward, p.optimizer, p.comm_wait, p.checkpoint)
        parts = [x for x in (p.forward, p.backward, p.optimizer) if x is not None]
        compute = sum(parts) if parts else None
        extra = dict(p.extra)
    return (
        rec.job_id or msg.job_id,
        rec.step,
        rec.rank,
        rec.world_size,
        rec.host or msg.host,
        rec.local_rank,
        rec.local_rank if rec.gpu is None else rec.gpu,
        rec.group,
        rec.start,
        rec.end,
        rec.end - rec.start,
        *phases,
        compute,
        extra,
        rec.samples,
        rec.tokens,
        f64(rec.loss),
        f64(rec.flops),
        rec.timing,
        rec.cpu_time,
        rec.cpu_wait,
        msg.inst,
        msg.seq,
    )


def gpu_row(msg: GpuMessage, g: GpuReading, derived: tuple[Any, ...], ver: int) -> tuple[Any, ...]:
    base = tuple(getattr(g, n) for n in _GPU_BASE)
    return (msg.ts, msg.job_id or "", msg.host, g.index, *base, *derived, ver, msg.inst, msg.seq)


def port_row(
    msg: PortMessage, p: PortReading, derived: tuple[Any, ...], ver: int
) -> tuple[Any, ...]:
    base = tuple(getattr(p, n) for n in _PORT_BASE)
    return (
        msg.ts,
        msg.job_id or "",
        msg.host,
        p.device,
        p.port,
        *base,
        *derived,
        ver,
        msg.inst,
        msg.seq,
    )


def event_row(msg: EventMessage) -> tuple[Any, ...]:
    return (
        msg.ts,
        msg.job_id or "",
        msg.host,
        msg.type.value,
        msg.rank,
        msg.gpu,
        msg.device or "",
        msg.port,
        msg.code,
        msg.detail,
        {k: text(v) for k, v in msg.attrs.items()},
        msg.inst,
        msg.seq,
    )


UNATTRIBUTED_HOST = "stepwatch"  # a detection's header host when it flags no host (events.md)


def detection_row(msg: DetectionMessage) -> tuple[Any, ...]:
    evidence = {k: text(v) for k, v in msg.evidence.items()}
    subject = evidence.get("host") or ("" if msg.host == UNATTRIBUTED_HOST else msg.host)
    return (
        msg.ts,
        msg.id,
        msg.job_id,
        msg.type,
        msg.state,
        msg.rank,
        msg.gpu,
        msg.group,
        msg.cause,
        msg.fault,
        f64(msg.score),
        msg.step,
        msg.first_step,
        msg.opened_at,
        msg.summary,
        evidence,
        subject,
        msg.host,
        msg.device or "",
        msg.port,
        list(msg.ranks),
        msg.related,
        msg.producer,
        msg.inst,
        msg.seq,
    )
