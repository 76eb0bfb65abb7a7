"""An :class:`~stepwatch.agents.collectors.nvml_api.NvmlApi` backed by a recording.

A recording (JSON, written by ``tests/fixtures/nvml/record.py`` on a GPU host)
holds, per GPU, its static identity and a list of samples taken every
``interval_s`` seconds; each sample maps a :class:`Field` to NVML's raw value,
or to ``{"error": "<reason>"}`` where NVML refused. Replay follows the clock:
the sample shown is the one recorded that long after the start; past the end it
wraps around, and cumulative counters keep growing across wraps so they never
go backwards. Recorded events fire once, at their offset.

Used by the ``nvml-replay`` collector (benchmarks, the demo, GPU-less hosts)
and by tests, which can also inject failures and XID events.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from stepwatch.agents.collectors.nvml_api import COUNTER_FIELDS, Field, NvmlError, NvmlEvent
from stepwatch.errors import ConfigError

FORMAT = "stepwatch-nvml-recording"
XID_EVENT_TYPE = 8  # nvmlEventTypeXidCriticalError
DEFAULT_RECORDING = Path(__file__).resolve().parent / "data" / "h100_8gpu.json"


class DeviceRecording(msgspec.Struct):
    index: int
    static: dict[str, Any]
    samples: list[dict[str, Any]]
    xid_events: bool = True  # whether the GPU accepted XID event registration


class RecordedEvent(msgspec.Struct):
    t: float  # seconds after the recording started
    gpu: int
    data: int  # XID number
    type: int = XID_EVENT_TYPE


class Recording(msgspec.Struct):
    format: str
    version: int
    interval_s: float
    devices: list[DeviceRecording]
    events: list[RecordedEvent] = []
    source: str = ""
    recorded_at: str = ""
    driver_version: str = ""
    nvml_version: str = ""


def load_recording(path: str | Path) -> Recording:
    """Read and check a recording file; raise ConfigError when unusable."""
    try:
        recording = msgspec.json.decode(Path(path).read_bytes(), type=Recording)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as err:
        raise ConfigError(f"NVML recording {path}: {err}") from err
    if recording.format != FORMAT or recording.version != 1:
        raise ConfigError(f"NVML recording {path}: not a {FORMAT} v1 file")
    if recording.interval_s <= 0 or any(not d.samples for d in recording.devices):
        raise ConfigError(f"NVML recording {path}: needs interval_s > 0 and samples per GPU")
    return recording


class ReplayNvml:
    """Fake NVML replaying a :class:`Recording` against ``clock``."""

    def __init__(
        self,
        recording: Recording,
        clock: Callable[[], float] = time.monotonic,
        unavailable: str | None = None,
    ) -> None:
        self.recording = recording
        self._clock = clock
        self._unavailable = unavailable
        self._t0: float | None = None
        self._devices = {d.index: d for d in recording.devices}
        self._failures: dict[tuple[int, Field], str] = {}
        self._injected: list[NvmlEvent] = []
        self._due = sorted(recording.events, key=lambda e: e.t)
        self._registered: set[int] = set()
        self.calls = 0

    @classmethod
    def from_file(cls, path: str | Path = DEFAULT_RECORDING, **kwargs: Any) -> ReplayNvml:
        return cls(load_recording(path), **kwargs)

    # ------------------------------------------------------------ test hooks
    def fail(self, gpu: int, field: Field, reason: str | None) -> None:
        """Make ``field`` of ``gpu`` raise NvmlError(reason); None clears it."""
        if reason is None:
            self._failures.pop((gpu, field), None)
        else:
            self._failures[(gpu, field)] = reason

    def inject_xid(self, gpu: int, xid: int) -> None:
        self._injected.append(NvmlEvent(gpu=gpu, event_type=XID_EVENT_TYPE, data=xid))

    # ------------------------------------------------------------ NvmlApi
    def init(self) -> None:
        if self._unavailable:
            raise NvmlError(self._unavailable, "replay configured as unavailable")
        self._t0 = self._clock()

    def shutdown(self) -> None:
        self._t0 = None

    def device_count(self) -> int:
        self._check_init()
        return len(self._devices)

    def handle(self, index: int) -> Any:
        self._check_init()
        if index not in self._devices:
            raise NvmlError("invalid_argument", f"no GPU {index}")
        return index

    def read(self, handle: Any, field: Field) -> Any:
        self._check_init()
        self.calls += 1
        device = self._devices[handle]
        failure = self._failures.get((handle, field))
        if failure:
            raise NvmlError(failure, f"injected on GPU {handle}")
        if field in device.static:
            return _checked(field, device.static[field])
        tick = self._tick()
        n = len(device.samples)
        value = _checked(field, device.samples[tick % n].get(field))
        if field in COUNTER_FIELDS and tick >= n:
            value = _extrapolate(device.samples, field, value, tick // n)
        return value

    def xid_event_set(self, handles: list[Any]) -> Any:
        self._check_init()
        accepted = {h for h in handles if self._devices[h].xid_events}
        if not accepted:
            raise NvmlError("not_supported", "no GPU accepts XID events")
        self._registered |= accepted
        return "replay-event-set"

    def wait_event(self, event_set: Any, timeout_ms: int) -> NvmlEvent | None:
        self._check_init()
        while self._injected:
            event = self._injected.pop(0)
            if event.gpu in self._registered:
                return event
        elapsed = self._clock() - (self._t0 or 0.0)
        while self._due and self._due[0].t <= elapsed:
            due = self._due.pop(0)
            if due.gpu in self._registered:
                return NvmlEvent(gpu=due.gpu, event_type=due.type, data=due.data)
        return None

    def free_event_set(self, event_set: Any) -> None:
        self._registered.clear()

    # ------------------------------------------------------------ helpers
    def _check_init(self) -> None:
        if self._t0 is None:
            raise NvmlError("uninitialized", "call init() first")

    def _tick(self) -> int:
        elapsed = self._clock() - (self._t0 or 0.0)
        return max(0, int(elapsed / self.recording.interval_s))


def _checked(field: Field, value: Any) -> Any:
    """A recorded value, or the NvmlError recorded in its place."""
    if value is None:
        raise NvmlError("not_supported", f"{field} not in recording")
    if isinstance(value, dict):
        raise NvmlError(str(value.get("error", "unknown")), "recorded error")
    return value


def _extrapolate(samples: list[dict[str, Any]], field: Field, value: Any, cycles: int) -> Any:
    """Shift a counter by whole recording spans so it keeps growing across wraps."""
    first, last = samples[0].get(field), samples[-1].get(field)
    if isinstance(value, list):
        if not (isinstance(first, list) and isinstance(last, list)):
            return value
        return [
            v + cycles * _span(a, b, len(samples))
            for v, a, b in zip(value, first, last, strict=False)
        ]
    if isinstance(first, int | float) and isinstance(last, int | float):
        return value + cycles * _span(first, last, len(samples))
    return value


def _span(first: int | float, last: int | float, n: int) -> int | float:
    """Growth over one wrap: first->last plus one average step."""
    growth = last - first
    step = growth / (n - 1) if n > 1 else 0
    total = growth + step
    return int(total) if isinstance(first, int) and isinstance(last, int) else total
