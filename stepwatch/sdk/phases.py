"""Phase names: the contract's fields, common aliases, and everything else in ``extra``.

A name is normalised (lower case; ``-``, ``_`` and spaces are equivalent) and
looked up in :data:`ALIASES`; a known name lands in its ``Phases`` field, any
other name in ``Phases.extra`` under the name as given. A phase measured
several times in one step (gradient accumulation) is summed.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

from stepwatch.contract.records import Phases, plain_name

MAX_EXTRA = 32  # distinct extra names per step; more are dropped (see StepWatch.stats)
MAX_NAME = 64


class Phase(enum.StrEnum):
    """The contract's phase fields."""

    DATA = "data"
    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"
    COMM_WAIT = "comm_wait"
    CHECKPOINT = "checkpoint"


_ALIAS_TABLE: dict[Phase, tuple[str, ...]] = {
    Phase.DATA: (
        "data",
        "batch-generator",
        "data-loading",
        "dataloader",
        "data-loader",
        "batch",
        "input",
    ),
    # Megatron's forward-backward timer covers both passes: it is recorded as
    # `forward` with `backward` absent, so forward + backward stays the compute time.
    Phase.FORWARD: ("forward", "fwd", "forward-backward", "forward-compute"),
    Phase.BACKWARD: ("backward", "bwd", "backward-compute"),
    Phase.OPTIMIZER: ("optimizer", "optim", "opt", "optimizer-step", "step-optimizer"),
    Phase.COMM_WAIT: (
        "comm-wait",
        "comm",
        "all-grads-sync",
        "allreduce",
        "all-reduce",
        "grad-sync",
        "grads-reduce-scatter",
        "params-all-gather",
    ),
    Phase.CHECKPOINT: ("checkpoint", "ckpt", "save-checkpoint", "checkpoint-save"),
}


def normalise(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


ALIASES: dict[str, Phase] = {
    normalise(alias): phase for phase, names in _ALIAS_TABLE.items() for alias in names
}


def canonical(name: str) -> Phase | None:
    """The contract field a phase name maps to, or None for an extra phase."""
    return ALIASES.get(normalise(name))


def to_phases(durations: Iterable[tuple[str, float]]) -> tuple[Phases, int]:
    """Sum (name, seconds) pairs into a Phases record; also return extra names dropped."""
    fields: dict[str, float] = {}
    extra: dict[str, float] = {}
    dropped = 0
    for given, seconds in durations:
        name = given if isinstance(given, str) else str(given)  # None: "None", not a lost step
        phase = canonical(name)
        if phase is not None:
            fields[phase.value] = fields.get(phase.value, 0.0) + seconds
            continue
        # a control character in a name made the agent refuse the whole step (schema)
        key = plain_name(name.strip())[:MAX_NAME] or "unnamed"
        if key not in extra and len(extra) >= MAX_EXTRA:
            dropped += 1
            continue
        extra[key] = extra.get(key, 0.0) + seconds
    return Phases(**fields, extra=extra), dropped
