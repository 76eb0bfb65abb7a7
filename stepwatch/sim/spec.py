"""Text form of a fault, for the command line: ``KIND[:key=value]...``.

Example: ``slow_gpu:rank=5:start=100:severity=0.1``. Keys: ``rank``, ``host``,
``gpu``, ``nic``, ``start`` (or ``start_step``), ``end`` (or ``end_step``),
``severity``, ``duration`` (seconds, link flaps), ``job`` (which job of several;
an index from 0 or a job id; default the first).
"""

from __future__ import annotations

from dataclasses import dataclass

from stepwatch.errors import ConfigError
from stepwatch.sim.scenario import Fault, FaultKind

_INT = {
    "rank": "rank",
    "gpu": "gpu",
    "nic": "nic",
    "start": "start_step",
    "start_step": "start_step",
    "end": "end_step",
    "end_step": "end_step",
}
_FLOAT = {
    "severity": "severity",
    "duration": "duration_seconds",
    "duration_seconds": "duration_seconds",
}


@dataclass(frozen=True)
class FaultSpec:
    fault: Fault
    job: str | None = None  # job index or id, None: the first job


def parse_fault(text: str) -> FaultSpec:
    """Parse ``KIND[:key=value]...`` into a Fault (ConfigError with the reason)."""
    kind, *pairs = [p for p in text.strip().split(":") if p]
    values: dict[str, object] = {"kind": FaultKind.parse(kind)}
    job: str | None = None
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key = key.strip().lower()
        if not sep:
            raise ConfigError(f"fault {text!r}: expected key=value, got {pair!r}")
        try:
            if key in _INT:
                values[_INT[key]] = int(raw)
            elif key in _FLOAT:
                values[_FLOAT[key]] = float(raw)
            elif key == "host":
                values["host"] = raw
            elif key == "job":
                job = raw
            else:
                raise ConfigError(f"fault {text!r}: unknown key {key!r}")
        except ValueError as err:
            raise ConfigError(f"fault {text!r}: bad value for {key}: {raw!r}") from err
    return FaultSpec(Fault(**values), job)  # type: ignore[arg-type]
