"""Every knob of the detection core, with defaults tuned on the simulator suite.

``DetectConfig`` is frozen; build it once (``DetectConfig.from_settings`` takes
the hang knobs from :class:`stepwatch.settings.Settings`) and hand it to
:class:`stepwatch.streams.core.engine.Engine`. Times are event-time seconds, counts are
steps.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from stepwatch.errors import ConfigError

if TYPE_CHECKING:
    from stepwatch.settings import Settings

# Peak dense BF16 FLOP/s per GPU, matched as a case-insensitive substring of
# GpuReading.name (NVML / DCGM modelName). First match wins: put specific names first.
DEFAULT_GPU_PEAK_FLOPS: tuple[tuple[str, float], ...] = (
    ("GH200", 989e12),
    ("H200", 989e12),
    ("H100 PCIe", 756e12),
    ("H100", 989e12),
    ("H800", 989e12),
    ("GB200", 2.5e15),
    ("B200", 2.25e15),
    ("A100", 312e12),
    ("A800", 312e12),
    ("L40S", 362e12),
)


@dataclass(frozen=True)
class DetectConfig:
    """Detection thresholds, windows and limits (see docs/detection.md)."""

    # --- step assembly -----------------------------------------------------------
    assembly_deadline_seconds: float = 5.0  # close a step this long after its latest record
    max_pending_steps: int = 64  # more open steps than this: the oldest is closed at once
    # --- straggler (rank vs its peer group) --------------------------------------
    warmup_steps: int = 5  # first steps of a job are not scored
    # steps after a restart from a checkpoint that are not scored: caches, compilation and
    # data loaders warm up again, on a job whose baseline already exists
    restart_warmup_steps: int = 10
    window_steps: int = 8  # n: the persistence window
    persist_steps: int = 5  # k: flagged in k of the last n steps opens a detection
    straggler_min_seconds: float = 2.0  # ... and its run of flags began this long before
    straggler_min_excess: float = 0.04  # busy time >= 4 % above the group median
    straggler_phase_floor_ratio: float = 0.67  # one phase above its median by this x min_excess
    straggler_step_z: float = 2.5  # a step is flagged this many robust sigmas above
    straggler_z: float = 5.0  # the window's median excess this many standard errors above
    # an incident's excess must cost the step this share of its time (median step time,
    # pauses left out); a smaller one is a *suspect*: counted and shown, never paged
    straggler_material_share: float = 0.03
    # ... and its robust CUSUM (clipped, standardised excess minus that share, see
    # streams/core/cusum.py) must reach h: a bounded false-alarm rate under heavy tails
    straggler_cusum_h: float = 6.0
    straggler_cusum_clip: float = 2.0
    # a new incident whose cause is only what is left (compute longer, with no GPU
    # telemetry of the rank to look at) on a rank that waits for a CPU at least
    # straggler_unproven_wait_share of its runnable time, and whose excess is below
    # straggler_unproven_excess, stays a suspect until its slowness has lasted
    # straggler_unproven_seconds: an oversubscribed CPU inflates CPU time like a compute
    # fault, and a drain costs too much for a burst of a neighbour's load
    straggler_unproven_excess: float = 0.15
    straggler_unproven_wait_share: float = 0.25
    straggler_unproven_seconds: float = 30.0
    straggler_clear_ratio: float = 0.5  # still flagged while score >= this x threshold
    min_group_size: int = 3  # groups smaller than this cannot be compared
    require_comm_corroboration: bool = True  # straggler must wait least in collectives
    # --- job / group slowdown (vs own history) ------------------------------------
    baseline_steps: int = 128  # history kept for the job's own baseline
    min_baseline_steps: int = 20  # no job_slowdown verdict before this many steps
    slowdown_min_excess: float = 0.05  # straggler-free step time >= 5 % above baseline
    slowdown_z: float = 5.0
    # k for the job's own history: global transients (a congestion burst of a few steps
    # next to a GC or evaluation pause) move it, while peer comparison cancels them
    slowdown_persist_steps: int = 6
    # ... and the slow run of steps must have lasted this long (event time): Falcon's
    # slowdowns last tens of seconds or more, while a loaded machine's few-second dips slow
    # every rank of a fast job alike (a healthy 0.24 s-step DDP job on a loaded CI machine
    # opened one, cause unknown). Jobs of steps over ~1.7 s are not delayed by it.
    slowdown_min_seconds: float = 10.0
    # jobs of at most this many hosts also compare each host with its own history: a slow
    # host that is half of the job has no majority of peers to stand out against
    host_history_max_hosts: int = 8
    # ... and each host against the job's other hosts (hostsplit.py): off by default
    host_split: bool = False
    # --- lifecycle ----------------------------------------------------------------
    resolve_steps: int = 10  # m: condition clear for m steps resolves a detection
    update_min_seconds: float = 30.0  # at most one score update per detection per this
    # an open detection's cause is re-decided this often during its first update_min_seconds
    # (then every update_min_seconds); a changed cause is published at once
    cause_refresh_seconds: float = 10.0
    update_score_change: float = 0.25  # relative score change that warrants an update
    update_score_abs: float = 0.03  # ... and at least this much in absolute terms
    # --- hang / missing ranks ------------------------------------------------------
    hang_min_seconds: float = 60.0
    hang_step_multiple: float = 10.0
    # the longest pause the hang limit allows for, at most (a checkpoint_save event's
    # ``seconds`` is the sender's word: one of 10^12 s hid every later hang); well under
    # job_silence_seconds, so that a hang is found before its job is forgotten
    hang_max_pause_seconds: float = 1800.0
    rank_missing_steps: int = 3  # absent from this many closed steps while peers progress
    max_named_ranks: int = 8  # rank_missing detections per incident (evidence counts all)
    # --- causes -----------------------------------------------------------------------
    host_window_seconds: float = 60.0  # default look-back for GPU/port/event signals
    host_samples: int = 128  # samples (and events) kept per host and kind
    hot_temp_c: float = 85.0
    low_clock_ratio: float = 0.97  # SM clock below this x max clock (and 2 % below peers)
    power_cap_ratio: float = 0.98  # power at or above this x limit
    congestion_ratio: float = 4.0  # ECN/CNP/xmit_wait rate this x the job's median host
    min_cnp_per_second: float = 50.0
    min_xmit_wait_per_second: float = 1e5
    # network detections from the counters alone (streams/core/netwatch.py)
    net_check_seconds: float = 10.0  # judge the job's ports this often (event time)
    net_window_seconds: float = 20.0  # over this window
    net_persist_seconds: float = 10.0  # a port stands out in every check this long: detection
    data_share_for_input: float = 0.5  # data phase holds this share of the excess
    gpu_peak_flops: tuple[tuple[str, float], ...] = DEFAULT_GPU_PEAK_FLOPS
    # --- memory ---------------------------------------------------------------------
    job_end_grace_seconds: float = 300.0  # keep an ended job this long (late records)
    job_silence_seconds: float = 3600.0  # forget a job silent this long
    host_silence_seconds: float = 900.0  # forget a host silent this long
    throughput_steps: int = 32  # steps over which samples/s, tokens/s, MFU are computed

    def __post_init__(self) -> None:
        for name in ("persist_steps", "slowdown_persist_steps"):
            if not 0 < getattr(self, name) <= self.window_steps:
                raise ConfigError(f"{name} must be in 1..window_steps")
        if self.min_baseline_steps >= self.baseline_steps:
            raise ConfigError("min_baseline_steps must be < baseline_steps")
        for name in ("assembly_deadline_seconds", "hang_min_seconds", "hang_step_multiple"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be > 0")
        if not self.slowdown_min_seconds >= 0:
            raise ConfigError("slowdown_min_seconds must be >= 0")
        if self.min_group_size < 2 or self.resolve_steps < 1:
            raise ConfigError("min_group_size must be >= 2 and resolve_steps >= 1")

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: Any) -> DetectConfig:
        """The defaults, with the hang knobs and ``host_split`` from ``settings`` and
        explicit overrides."""
        values: dict[str, Any] = {
            "hang_min_seconds": settings.hang_min_seconds,
            "hang_step_multiple": settings.hang_step_multiple,
            "host_split": settings.host_split,
        }
        values.update(overrides)
        return cls(**values)

    def replace(self, **changes: Any) -> DetectConfig:
        return dataclasses.replace(self, **changes)

    def peak_flops(self, gpu_name: str) -> float | None:
        """Peak dense BF16 FLOP/s of a GPU model name, None when unknown."""
        lowered = gpu_name.lower()
        for needle, peak in self.gpu_peak_flops:
            if needle.lower() in lowered:
                return peak
        return None
