"""PyTorch integration: measure what DDP and FSDP hide, without synchronizing the device.

::

    import stepwatch
    from stepwatch.integrations.torch import instrument_ddp

    sw = stepwatch.init()
    model = DDP(net)
    instrument_ddp(model, sw)        # before the first backward
    ...
    with sw.step() as s:
        with s.phase("data"): ...
        with s.phase("forward"): loss = model(x)
        with s.phase("backward"): loss.backward()   # split into backward + comm_wait
        with s.phase("optimizer"): opt.step()

DDP waits for its gradient all-reduces at the end of ``backward()``: the fast
ranks' wait for a slow one is inside their backward. The integration splits
each ``backward`` phase at the moment the rank launched its last gradient
bucket: compute before, exposed ``comm_wait`` after. See docs/sdk.md.

torch is imported only when these functions run (``pip install 'stepwatch[torch]'``).
Nothing here raises into training: a failure of the timing is logged once,
counted in ``handle.stats()``, and the training step runs as it would without it.
"""

from __future__ import annotations

import logging
from typing import Any

from stepwatch.errors import StepwatchError
from stepwatch.extras import hint, require
from stepwatch.integrations.torch.split import CommStats, WaitSplitter
from stepwatch.sdk import StepWatch
from stepwatch.sdk.phases import Phase

logger = logging.getLogger(__name__)

INSTALL_HINT = hint("torch", "the torch integration")  # ... pip install 'stepwatch[torch]'

__all__ = ["INSTALL_HINT", "CommStats", "Instrumented", "instrument_ddp", "instrument_fsdp"]


class Instrumented:
    """What ``instrument_*`` returns: statistics, and ``remove()`` to stop splitting."""

    def __init__(self, sw: StepWatch, splitter: WaitSplitter, kind: str) -> None:
        self.sw = sw
        self.splitter = splitter
        self.kind = kind

    def stats(self) -> dict[str, object]:
        return {"kind": self.kind, **self.splitter.stats.as_dict()}

    def remove(self) -> None:
        """Stop rewriting steps (a DDP comm hook cannot be unregistered: it keeps
        forwarding to the real hook and its marks are dropped)."""
        self.sw.remove_step_hook(self.splitter)


def require_torch() -> Any:
    """``import torch``, or a one-line error naming the extra to install
    (:class:`~stepwatch.errors.MissingDependencyError`)."""
    require("torch", what="the torch integration")
    import torch

    return torch


def instrument_ddp(
    model: Any, sw: StepWatch, *, hook: Any = None, state: Any = None, time_buckets: bool = False
) -> Instrumented:
    """Register a timing DDP communication hook on ``model`` (a
    ``DistributedDataParallel``) and split ``backward`` into ``backward`` +
    ``comm_wait`` in every step of ``sw``.

    DDP accepts one comm hook: to keep your own (e.g. ``fp16_compress_hook``) pass
    it as ``hook`` with its ``state``; the default is DDP's all-reduce. Call before
    the first backward. ``time_buckets=True`` also sums every bucket's all-reduce
    wall time into ``stats()["comm_seconds"]`` (meaningful with gloo; a Python
    callback per bucket). Raises only for misuse at set-up (not a DDP model, a hook
    already registered); after that nothing raises into training.
    """
    require_torch()
    from stepwatch.integrations.torch.ddp import default_hook, timed_hook

    if not hasattr(model, "register_comm_hook"):
        raise StepwatchError(
            f"instrument_ddp needs a DistributedDataParallel model, got {type(model).__name__}"
        )
    if hook is None:
        hook, default_state = default_hook()
        state = default_state if state is None else state
    splitter = WaitSplitter(Phase.BACKWARD)
    try:
        model.register_comm_hook(state, timed_hook(sw, splitter, hook, time_buckets))
    except RuntimeError as err:
        raise StepwatchError(f"could not register the DDP comm hook: {err}") from err
    sw.add_step_hook(splitter)
    logger.info("stepwatch torch: DDP instrumented rank=%s timing=%s", sw.identity.rank, sw.timing)
    return Instrumented(sw, splitter, "ddp")


def instrument_fsdp(model: Any, sw: StepWatch) -> Instrumented:
    """Time FSDP's exposed waits; see :mod:`stepwatch.integrations.torch.fsdp`."""
    require_torch()
    from stepwatch.integrations.torch.fsdp import instrument

    return instrument(model, sw)
