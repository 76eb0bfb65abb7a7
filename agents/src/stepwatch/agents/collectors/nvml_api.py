"""A thin, injectable face over NVML (``nvidia-ml-py``, module ``pynvml``).

The collector never touches ``pynvml`` directly: it talks to an :class:`NvmlApi`
(this module's :class:`RealNvml`, or the recording-backed fake in
:mod:`stepwatch.agents.collectors.nvml_replay`). Every reading is named by a
:class:`Field` and returned in NVML's own units (mW, bytes, mJ, KiB); the
collector converts. Every NVML failure comes out as :class:`NvmlError` with a
short ``reason`` (``not_supported``, ``gpu_lost``, ``library_not_found`` ...).
"""

from __future__ import annotations

import ctypes
import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from stepwatch.errors import CollectorError

UINT_MAX = 0xFFFFFFFF  # scopeId meaning "summed over all NVLink links"


class Field(enum.StrEnum):
    """One NVML reading per GPU, in NVML's units. The value is also the key used
    in recordings (see ``tests/fixtures/nvml/record.py``)."""

    UUID = "uuid"
    NAME = "name"
    PCI_BUS_ID = "pci_bus_id"
    UTILIZATION = "utilization"  # [gpu %, memory %]
    MEMORY = "memory"  # [used bytes, free bytes, total bytes]
    TEMP_GPU = "temperature_gpu"  # °C
    TEMP_MEM = "temperature_memory"  # °C, HBM (field NVML_FI_DEV_MEMORY_TEMP)
    POWER = "power_usage_mw"  # mW
    POWER_LIMIT = "enforced_power_limit_mw"  # mW
    ENERGY = "total_energy_mj"  # mJ since driver load
    SM_CLOCK = "sm_clock_mhz"
    SM_CLOCK_MAX = "sm_clock_max_mhz"
    MEM_CLOCK = "mem_clock_mhz"
    CLOCK_REASONS = "clocks_event_reasons"  # bitmask
    ECC_CORRECTED = "ecc_corrected_volatile"  # since the last driver load
    ECC_UNCORRECTED = "ecc_uncorrected_volatile"
    REMAPPED_ROWS = "remapped_rows"  # [correctable, uncorrectable, pending, failure]
    PCIE_REPLAY = "pcie_replay_counter"
    NVLINK = "nvlink_throughput_kib"  # [tx KiB, rx KiB], data payload, all links


STATIC_FIELDS = (Field.UUID, Field.NAME, Field.PCI_BUS_ID)
COUNTER_FIELDS = frozenset(
    {Field.ENERGY, Field.ECC_CORRECTED, Field.ECC_UNCORRECTED, Field.PCIE_REPLAY, Field.NVLINK}
)

# NVML return codes -> our reasons (nvml.h, nvmlReturn_t).
_REASONS = {
    1: "uninitialized",
    2: "invalid_argument",
    3: "not_supported",
    4: "no_permission",
    6: "not_found",
    9: "driver_not_loaded",
    10: "timeout",
    12: "library_not_found",
    13: "function_not_found",
    15: "gpu_lost",
    999: "unknown",
}
UNAVAILABLE = frozenset({"library_not_found", "driver_not_loaded", "import_error"})
"""Reasons meaning NVML as a whole is unusable on this host."""
UNSUPPORTED = frozenset({"not_supported", "function_not_found"})
"""Reasons meaning this GPU/driver lacks the reading: a None, not an error."""


class NvmlError(CollectorError):
    """An NVML call failed; ``reason`` is a short code (see ``_REASONS``)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"nvml {reason}" + (f": {detail}" if detail else ""))
        self.reason = reason


@dataclass(frozen=True)
class NvmlEvent:
    gpu: int
    event_type: int
    data: int  # the XID number for XID events


class NvmlApi(Protocol):
    """What the NVML collector needs from NVML. Every method raises NvmlError."""

    def init(self) -> None: ...

    def shutdown(self) -> None: ...

    def device_count(self) -> int: ...

    def handle(self, index: int) -> Any: ...

    def read(self, handle: Any, field: Field) -> Any: ...

    def xid_event_set(self, handles: list[Any]) -> Any:
        """Create an event set and register XID events on every handle that
        supports them; raise NvmlError when none does."""
        ...

    def wait_event(self, event_set: Any, timeout_ms: int) -> NvmlEvent | None:
        """One pending event, or None when there is none within the timeout."""
        ...

    def free_event_set(self, event_set: Any) -> None: ...


def reason_of(err: BaseException) -> str:
    """Our reason code for a pynvml exception."""
    code = getattr(err, "value", None)
    if isinstance(code, int):
        return _REASONS.get(code, f"nvml_{code}")
    return "unknown"


class RealNvml:
    """:class:`NvmlApi` over the real library. ``pynvml`` is imported in :meth:`init`."""

    def __init__(self) -> None:
        self._nv: Any = None
        self._index_by_addr: dict[int, int] = {}
        self._readers: dict[Field, Callable[[Any], Any]] = {}

    def init(self) -> None:
        try:
            import pynvml
        except ImportError as err:
            raise NvmlError("import_error", "pip install nvidia-ml-py") from err
        self._call(pynvml.nvmlInit)
        self._nv = pynvml
        self._readers = self._build_readers(pynvml)

    def shutdown(self) -> None:
        if self._nv is not None:
            nv, self._nv = self._nv, None
            self._call(nv.nvmlShutdown)

    def device_count(self) -> int:
        return int(self._call(self._nv.nvmlDeviceGetCount))

    def handle(self, index: int) -> Any:
        handle = self._call(self._nv.nvmlDeviceGetHandleByIndex, index)
        self._index_by_addr[_address(handle)] = index
        return handle

    def read(self, handle: Any, field: Field) -> Any:
        return self._call(self._readers[field], handle)

    def xid_event_set(self, handles: list[Any]) -> Any:
        nv = self._nv
        event_set = self._call(nv.nvmlEventSetCreate)
        registered = 0
        last: NvmlError | None = None
        for handle in handles:
            try:
                self._call(
                    nv.nvmlDeviceRegisterEvents, handle, nv.nvmlEventTypeXidCriticalError, event_set
                )
                registered += 1
            except NvmlError as err:
                last = err
        if not registered:
            self.free_event_set(event_set)
            raise last or NvmlError("not_supported", "no GPU accepts XID events")
        return event_set

    def wait_event(self, event_set: Any, timeout_ms: int) -> NvmlEvent | None:
        try:
            data = self._call(self._nv.nvmlEventSetWait_v2, event_set, timeout_ms)
        except NvmlError as err:
            if err.reason == "timeout":
                return None
            raise
        gpu = self._index_by_addr.get(_address(data.device), -1)
        return NvmlEvent(gpu=gpu, event_type=int(data.eventType), data=int(data.eventData))

    def free_event_set(self, event_set: Any) -> None:
        self._call(self._nv.nvmlEventSetFree, event_set)

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except NvmlError:
            raise
        except Exception as err:  # pynvml.NVMLError and its generated subclasses
            if type(err).__name__.startswith("NVMLError"):
                raise NvmlError(reason_of(err), str(err)) from err
            raise NvmlError("unknown", repr(err)) from err

    @staticmethod
    def _build_readers(nv: Any) -> dict[Field, Callable[[Any], Any]]:
        def utilization(h: Any) -> list[int]:
            u = nv.nvmlDeviceGetUtilizationRates(h)
            return [int(u.gpu), int(u.memory)]

        def memory(h: Any) -> list[int]:
            m = nv.nvmlDeviceGetMemoryInfo(h)
            return [int(m.used), int(m.free), int(m.total)]

        def ecc(kind: int) -> Callable[[Any], int]:
            return lambda h: int(nv.nvmlDeviceGetTotalEccErrors(h, kind, nv.NVML_VOLATILE_ECC))

        return {
            Field.UUID: nv.nvmlDeviceGetUUID,
            Field.NAME: nv.nvmlDeviceGetName,
            Field.PCI_BUS_ID: lambda h: _text(nv.nvmlDeviceGetPciInfo(h).busId),
            Field.UTILIZATION: utilization,
            Field.MEMORY: memory,
            Field.TEMP_GPU: lambda h: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
            Field.TEMP_MEM: lambda h: _field_values(nv, h, [nv.NVML_FI_DEV_MEMORY_TEMP])[0],
            Field.POWER: nv.nvmlDeviceGetPowerUsage,
            Field.POWER_LIMIT: nv.nvmlDeviceGetEnforcedPowerLimit,
            Field.ENERGY: nv.nvmlDeviceGetTotalEnergyConsumption,
            Field.SM_CLOCK: lambda h: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
            Field.SM_CLOCK_MAX: lambda h: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM),
            Field.MEM_CLOCK: lambda h: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM),
            Field.CLOCK_REASONS: lambda h: _clock_reasons(nv, h),
            Field.ECC_CORRECTED: ecc(nv.NVML_MEMORY_ERROR_TYPE_CORRECTED),
            Field.ECC_UNCORRECTED: ecc(nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
            Field.REMAPPED_ROWS: lambda h: [int(v) for v in nv.nvmlDeviceGetRemappedRows(h)],
            Field.PCIE_REPLAY: nv.nvmlDeviceGetPcieReplayCounter,
            Field.NVLINK: lambda h: _field_values(
                nv,
                h,
                [
                    (nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, UINT_MAX),
                    (nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, UINT_MAX),
                ],
            ),
        }


def _clock_reasons(nv: Any, handle: Any) -> int:
    """``nvmlDeviceGetCurrentClocksEventReasons``, or the older ThrottleReasons name."""
    fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
    if fn is not None:
        try:
            return int(fn(handle))
        except nv.NVMLError as err:
            if reason_of(err) not in UNSUPPORTED:
                raise
    return int(nv.nvmlDeviceGetCurrentClocksThrottleReasons(handle))


def _field_values(nv: Any, handle: Any, ids: list[Any]) -> list[int | float]:
    """Read NVML field values; a per-field failure raises that field's error."""
    out: list[int | float] = []
    for value in nv.nvmlDeviceGetFieldValues(handle, ids):
        if value.nvmlReturn != nv.NVML_SUCCESS:
            raise nv.NVMLError(value.nvmlReturn)
        out.append(_typed(nv, value))
    return out


def _typed(nv: Any, value: Any) -> int | float:
    kind = value.valueType
    if kind == nv.NVML_VALUE_TYPE_DOUBLE:
        return float(value.value.dVal)
    if kind == nv.NVML_VALUE_TYPE_UNSIGNED_INT:
        return int(value.value.uiVal)
    if kind == nv.NVML_VALUE_TYPE_UNSIGNED_LONG:
        return int(value.value.ulVal)
    if kind == nv.NVML_VALUE_TYPE_SIGNED_LONG_LONG:
        return int(value.value.sllVal)
    return int(value.value.ullVal)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _address(handle: Any) -> int:
    return ctypes.cast(handle, ctypes.c_void_p).value or 0
