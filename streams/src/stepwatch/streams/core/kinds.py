"""The closed sets of the detection core (values as they appear in DetectionMessage)."""

from __future__ import annotations

import enum


class DetectionType(enum.StrEnum):
    STRAGGLER = "straggler"  # one rank slower than its peer group
    JOB_SLOWDOWN = "job_slowdown"  # the job (or one peer group) slower than its own history
    HANG = "hang"  # no step progress for the job against its own cadence
    RANK_MISSING = "rank_missing"  # a rank stopped (or its telemetry did) while peers wait
    THROUGHPUT = "throughput"  # reserved: throughput loss is reported as job_slowdown
    USER_ERROR = "user_error"  # NaN/inf loss, an exception in user code, a failed job
    LINK_FLAP = "link_flap"  # a NIC link of the job's hosts went down
    NETWORK_CONGESTION = "network_congestion"  # a port's ECN/CNP/xmit_wait far above its peers'
    LINK_ERRORS = "link_errors"  # a port's error counters rise (symbol, recovery, receive)


class State(enum.StrEnum):
    OPEN = "open"
    UPDATE = "update"
    RESOLVED = "resolved"


class Cause(enum.StrEnum):
    GPU = "gpu"  # throttling, low clock, heat, power cap, non-fatal XID
    NETWORK = "network"  # ECN/CNP, xmit_wait, symbol errors, link down
    HOST_INPUT = "host_input"  # slow data phase with healthy GPU and NIC
    HARDWARE = "hardware"  # XID 79/48/95, double-bit ECC: a node to drain
    USER = "user"  # the job's own code
    UNKNOWN = "unknown"


class Fault(enum.StrEnum):
    SYSTEM = "system"  # remediation may act
    USER = "user"  # notify the user, never drain a node
    UNKNOWN = "unknown"
