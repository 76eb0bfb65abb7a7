"""Event contract v1: the records every part of stepwatch exchanges.

Records are frozen msgspec structs. A *message* is one Kafka record value (and
one line of a JSON Lines file); it always carries ``kind`` and ``v``. The
human-readable specification is ``docs/events.md``; this module is the
machine-checkable one. Timestamps are UTC epoch seconds (float). Counters are
raw cumulative values with their unit in the field name; rates are computed
downstream (see :mod:`stepwatch.contract.counters`).
"""

from __future__ import annotations

import enum
import re
from typing import Annotated

import msgspec

CONTRACT_VERSION = 1

# Value constraints are part of the schema: msgspec checks them while decoding
# (a value below its floor is reported as ``absurd_value``, one above its
# ceiling as ``overflow``), so no Python pass is needed. JSON numbers are
# always finite once decoded. The ceilings are the one set of bounds every
# consumer (stream worker, store, replay) applies: what fits the store's
# columns (UInt16/UInt32 indexes, Float32 gauges) and,
# for counters, a signed 64-bit integer, which every JSON reader can hold.
INT64_MAX = 2**63 - 1
UINT32_MAX = 2**32 - 1
UINT16_MAX = 2**16 - 1
FLOAT32_MAX = 3.4028234e38
Count = Annotated[int, msgspec.Meta(ge=0, le=INT64_MAX)]
Index32 = Annotated[int, msgspec.Meta(ge=0, le=UINT32_MAX)]  # ranks, XID codes
Index16 = Annotated[int, msgspec.Meta(ge=0, le=UINT16_MAX)]  # GPU index, port number
NonNeg = Annotated[float, msgspec.Meta(ge=0, le=FLOAT32_MAX)]  # gauges, durations
MAX_STEP_SECONDS = 7 * 24 * 3600.0  # a step, and each of its phases, lasts at most a week
# a phase's duration: a week at most, as a step (at 3.4e38 each, forward + backward, the
# store's compute_s, overflowed its Float32 column: the store refused a step the worker kept)
PhaseSeconds = Annotated[float, msgspec.Meta(ge=0, le=MAX_STEP_SECONDS)]
# what one rank's step may count: the store's per-minute rollups sum them in UInt64 (a
# Float64 for FLOPs), and two forged records of 2^63 tokens wrapped a job's minute to a
# small number; at these ceilings 16.7 million rank-steps a minute fit (16,384 ranks at
# 1,000 steps a minute), and no real step comes near one (10^12 tokens, 10^24 FLOPs)
STEP_COUNT_MAX = 2**40
STEP_FLOPS_MAX = 1e24
StepCount = Annotated[int, msgspec.Meta(ge=0, le=STEP_COUNT_MAX)]
# error counters (ECC, row remaps, PCIe replays): their increases are summed per GPU
# and minute, and by the gpu_errors query, in UInt64 as well
ErrorCount = Annotated[int, msgspec.Meta(ge=0, le=STEP_COUNT_MAX)]
StepFlops = Annotated[float, msgspec.Meta(ge=0, le=STEP_FLOPS_MAX)]
# epoch seconds; anything before 2001-09-09 (1e9 s) is a clock since boot (time.monotonic,
# perf_counter) or a unit slip, not a time: refused everywhere alike (``absurd_value``),
# as the worker would refuse it (too old) and a store would file it under 1970
MIN_EPOCH = 1e9
Epoch = Annotated[float, msgspec.Meta(ge=MIN_EPOCH)]  # the future is checked against the clock
Code = Annotated[int, msgspec.Meta(ge=-INT64_MAX - 1, le=INT64_MAX)]
# devices one host's message may describe: far more than any host has (8 to 16 GPUs,
# a few dozen RDMA ports), so that one message cannot make a consumer hold thousands
MAX_DEVICES = 256
# Names a sender chooses (host, job, group, agent instance, detection id) reach
# logs, Prometheus labels, the store and alert labels: bounded, and without
# control characters (C0, DEL, C1, line separators, bidi overrides), so a job id
# cannot forge a log line or repaint a terminal.
NAME_MAX = 256
NAME_PATTERN = (
    "^[^\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]*"
    "(?![\\s\\S])"  # not "$": it also matches before a final newline
)
# The pattern is in the JSON Schema; decoders check it in stepwatch.contract.names
# (a regular expression per name inside msgspec cost a third of a step message's decode)
Name = Annotated[
    str, msgspec.Meta(max_length=NAME_MAX, extra_json_schema={"pattern": NAME_PATTERN})
]
# Identifiers a device or driver gives (GPU uuid and model, NIC device, port state, a
# detection's type and cause) follow the same rule: they reach the same places.
# Free text (an event's detail, a detection's summary) may hold tabs and line breaks
# (a traceback), nothing else of the above, and is bounded too.
TEXT_MAX = 4096
TEXT_PATTERN = "^[^\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]*(?![\\s\\S])"
Text = Annotated[
    str, msgspec.Meta(max_length=TEXT_MAX, extra_json_schema={"pattern": TEXT_PATTERN})
]


# A map's keys are names (``EventMessage.attrs``, ``Phases.extra``,
# ``DetectionMessage.evidence``): they reach the same places (logs, the store's Map
# columns, alert labels) as the named fields do. Its values are data, as before: an
# exception's message may hold colour codes, and an old SDK's event must still pass.
Value = str | float | int | bool


def clip_text(text: str) -> str:
    """``text`` cut to ``TEXT_MAX`` characters (an ellipsis at the cut): what a producer
    writes into a ``Text`` field it builds from other fields (a summary quoting an
    event's detail) must stay valid for every reader."""
    return text if len(text) <= TEXT_MAX else text[: TEXT_MAX - 1] + "\u2026"


# what the text rule forbids (TEXT_PATTERN), and lone surrogates (os.fsdecode of a
# non-UTF-8 path, in an exception's message): no encoder writes them, the event was lost
_NOT_TEXT = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]"
)


def plain_text(text: str) -> str:
    """``text`` made a valid ``Text``: line ends as ``\\n``, every other forbidden
    character as U+FFFD, clipped. For producers of free text they do not control (an
    exception's message with colour codes): the event is kept, its text made safe."""
    return clip_text(_NOT_TEXT.sub("\ufffd", text.replace("\r\n", "\n")))


# what the name rule forbids (NAME_PATTERN): C0, DEL, C1, line separators, bidi overrides;
# and lone surrogates, which no encoder writes
NOT_NAME = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def plain_name(text: str) -> str:
    """``text`` made a valid ``Name``: every forbidden character as U+FFFD, clipped to
    ``NAME_MAX``. For names a producer passes on but does not choose (an alert's labels)."""
    text = NOT_NAME.sub("\ufffd", text)
    return text if len(text) <= NAME_MAX else text[: NAME_MAX - 1] + "\u2026"


class Kind(enum.StrEnum):
    """The message kinds, one topic each (see :mod:`stepwatch.contract.topics`)."""

    STEP = "step"
    GPU = "gpu"
    PORT = "port"
    EVENT = "event"
    DETECTION = "detection"


class EventType(enum.StrEnum):
    """Discrete events."""

    XID = "xid"
    ECC = "ecc"
    LINK_STATE = "link_state"
    JOB_START = "job_start"
    JOB_END = "job_end"
    CHECKPOINT_SAVE = "checkpoint_save"
    # a save (or load) begins: sent on entering ``sw.checkpoint``, so a job that stops
    # stepping for its first long save is not called hung before the save's end says how long
    CHECKPOINT_BEGIN = "checkpoint_begin"
    CHECKPOINT_LOAD = "checkpoint_load"
    RESTART = "restart"
    EXCEPTION = "exception"  # raised in user code (OOM, NaN loss, ...) as reported by the SDK
    # the node agent saw a rank's process end without the SDK's job_end (killed, crashed):
    # the agent's own observation, never a rank's word (not in the wire's RANK_EVENT_TYPES)
    RANK_EXIT = "rank_exit"


class _Base(msgspec.Struct, frozen=True, forbid_unknown_fields=False, omit_defaults=True, gc=False):
    pass


# --------------------------------------------------------------------------- steps
class Phases(_Base, frozen=True):
    """Phase durations of one step on one rank, in seconds.

    ``None`` means the phase was not measured (not the same as 0). ``comm_wait``
    is *exposed* communication wait: time the rank sat in a collective waiting
    for its peers, not overlapped with compute. ``extra`` holds any other named
    section (Megatron/TorchTitan timer names, for example).
    """

    data: PhaseSeconds | None = None
    forward: PhaseSeconds | None = None
    backward: PhaseSeconds | None = None
    optimizer: PhaseSeconds | None = None
    comm_wait: PhaseSeconds | None = None
    checkpoint: PhaseSeconds | None = None
    extra: dict[Name, PhaseSeconds] = {}


class StepRecord(_Base, frozen=True):
    """Timing of one training step on one rank."""

    job_id: Name
    rank: Index32
    world_size: Annotated[int, msgspec.Meta(ge=1, le=UINT32_MAX)]
    step: Count
    start: Epoch
    end: Epoch
    host: Name = ""
    local_rank: Index32 = 0
    gpu: Index16 | None = None  # GPU index on the host; defaults to local_rank when absent
    group: Name = "all"  # peer-group key: ranks are compared only with the same group
    phases: Phases | None = None
    samples: StepCount = 0
    tokens: StepCount = 0
    loss: float | None = None
    # JSON cannot carry NaN/inf: a non-finite loss travels as loss=null with
    # loss_nonfinite=true (a user-error signal: the detector decides).
    loss_nonfinite: bool = False
    flops: StepFlops | None = None  # model FLOPs this rank executed in this step (for MFU)
    timing: Name = "wall"  # "wall" (host clock) or "cuda" (CUDA events); the name rule
    # The rank's training thread over the step (Linux, /proc/thread-self/schedstat):
    # seconds it ran on a CPU, and seconds it was ready to run but waited for one
    # (run-queue delay). A larger waiting share than its peers' is CPU contention.
    cpu_time: NonNeg | None = None
    cpu_wait: NonNeg | None = None


# --------------------------------------------------------------------------- GPU
class GpuReading(_Base, frozen=True):
    """One GPU at one instant. Counters are cumulative since driver load."""

    index: Index16
    uuid: Name = ""
    name: Name = ""
    pci_bus_id: Name = ""
    util_gpu_pct: NonNeg | None = None
    util_mem_pct: NonNeg | None = None
    fb_used_mib: NonNeg | None = None
    fb_free_mib: NonNeg | None = None
    temp_gpu_c: NonNeg | None = None
    temp_mem_c: NonNeg | None = None
    power_w: NonNeg | None = None
    power_limit_w: NonNeg | None = None
    energy_mj_total: Count | None = None
    sm_clock_mhz: NonNeg | None = None
    sm_clock_max_mhz: NonNeg | None = None
    mem_clock_mhz: NonNeg | None = None
    throttle_reasons: Count | None = None  # NVML clocks-event reasons bitmask
    ecc_sbe_total: ErrorCount | None = None  # 2^40: a GPU with 10^12 errors is long gone
    ecc_dbe_total: ErrorCount | None = None
    remapped_rows_correctable: ErrorCount | None = None
    remapped_rows_uncorrectable: ErrorCount | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None  # no spare row left: the GPU needs replacing
    pcie_replay_total: ErrorCount | None = None
    nvlink_tx_bytes_total: Count | None = None
    nvlink_rx_bytes_total: Count | None = None
    gr_engine_active: NonNeg | None = None  # profiling ratios 0..1 (DCGM only)
    tensor_active: NonNeg | None = None
    dram_active: NonNeg | None = None
    xid_last: Index32 | None = None  # dcgm-exporter's gauge, for reference only


# --------------------------------------------------------------------------- NIC ports
class PortReading(_Base, frozen=True):
    """One RDMA port at one instant. Byte counters are already in bytes (sysfs x4)."""

    device: Name
    port: Index16
    netdev: Name = ""
    link_layer: Name = ""  # InfiniBand / Ethernet
    state: Name = ""  # e.g. ACTIVE
    phys_state: Name = ""  # e.g. LinkUp
    rate_gbps: NonNeg | None = None
    xmit_bytes_total: Count | None = None
    rcv_bytes_total: Count | None = None
    xmit_packets_total: Count | None = None
    rcv_packets_total: Count | None = None
    xmit_wait_total: Count | None = None
    symbol_error_total: Count | None = None
    link_downed_total: Count | None = None
    link_error_recovery_total: Count | None = None
    rcv_errors_total: Count | None = None
    rcv_remote_physical_errors_total: Count | None = None
    xmit_discards_total: Count | None = None
    excessive_buffer_overrun_errors_total: Count | None = None
    local_link_integrity_errors_total: Count | None = None
    vl15_dropped_total: Count | None = None
    # mlx5 hw_counters (RoCE congestion and transport errors)
    np_cnp_sent_total: Count | None = None
    np_ecn_marked_roce_packets_total: Count | None = None
    rp_cnp_handled_total: Count | None = None
    rp_cnp_ignored_total: Count | None = None
    out_of_sequence_total: Count | None = None
    packet_seq_err_total: Count | None = None
    implied_nak_seq_err_total: Count | None = None
    local_ack_timeout_err_total: Count | None = None
    rnr_nak_retry_err_total: Count | None = None
    duplicate_request_total: Count | None = None
    out_of_buffer_total: Count | None = None


# --------------------------------------------------------------------------- messages
class _Message(_Base, frozen=True, tag_field="kind", omit_defaults=False):
    """Common header: who sent it, when, and its place in the sender's sequence.

    ``seq`` counts from 0 per (``host``, ``inst``, ``kind``) without gaps, so
    loss and duplication are measurable downstream; ``inst`` changes whenever
    the sending agent restarts.
    """

    host: Name
    ts: Epoch
    v: int = CONTRACT_VERSION
    inst: Name = ""
    seq: Count = 0


class StepMessage(_Message, frozen=True, tag="step"):
    """Step records of one job gathered by one host's agent in one tick."""

    job_id: Name = ""
    steps: list[StepRecord] = []


class GpuMessage(_Message, frozen=True, tag="gpu"):
    """Every GPU of one host at one tick. ``job_id`` is set when the agent knows it."""

    job_id: Name | None = None
    gpus: Annotated[list[GpuReading], msgspec.Meta(max_length=MAX_DEVICES)] = []


class PortMessage(_Message, frozen=True, tag="port"):
    """Every RDMA port of one host at one tick."""

    job_id: Name | None = None
    ports: Annotated[list[PortReading], msgspec.Meta(max_length=MAX_DEVICES)] = []


class EventMessage(_Message, frozen=True, tag="event"):
    """A discrete event (XID, ECC, link change, job start/end, checkpoint, restart)."""

    type: EventType = EventType.XID
    job_id: Name | None = None
    rank: Index32 | None = None
    gpu: Index16 | None = None
    device: Name | None = None
    port: Index16 | None = None
    code: Code | None = None  # XID number, ECC count, exit code ...
    detail: Text = ""
    attrs: dict[Name, Value] = {}


class DetectionMessage(_Message, frozen=True, tag="detection"):
    """A detection's state change, produced by the stream processors.

    ``id`` is stable over the detection's lifecycle (open → update* → resolved).
    ``evidence`` holds the numbers that decided it.
    """

    id: Name = ""
    job_id: Name = ""
    # straggler | job_slowdown | hang | rank_missing | link_flap | network_congestion |
    # link_errors | throughput | user_error
    type: Name = ""
    state: Name = "open"  # open | update | resolved
    rank: Index32 | None = None
    gpu: Index16 | None = None
    group: Name = ""
    cause: Name = "unknown"  # gpu | network | host_input | hardware | user | unknown
    fault: Name = "unknown"  # system | user | unknown
    score: float | None = None
    step: Count | None = None
    first_step: Count | None = None
    opened_at: Epoch | None = None
    summary: Text = ""
    evidence: dict[Name, Value | None] = {}
    # v1 additions (defaults keep older messages valid): where a host- or
    # network-level incident is (``host`` in the header names the host), the
    # ranks it touches, and the id of the incident a linked detection belongs to.
    device: Name | None = None  # NIC device (network detections), e.g. mlx5_3
    port: Index16 | None = None  # NIC port number
    ranks: list[Index32] = []  # affected ranks of a host-level detection
    related: Name = ""  # id of the incident this detection belongs to ("" = its own)
    producer: Name = ""  # the stream worker that produced it (its name, default host:pid)


Message = StepMessage | GpuMessage | PortMessage | EventMessage | DetectionMessage

KIND_OF: dict[type, Kind] = {
    StepMessage: Kind.STEP,
    GpuMessage: Kind.GPU,
    PortMessage: Kind.PORT,
    EventMessage: Kind.EVENT,
    DetectionMessage: Kind.DETECTION,
}
