"""FSDP (``fully_shard``, FSDP2): time the waits for parameter all-gathers.

FSDP gathers each module's parameters before its forward and again before its
backward (unless kept unsharded), and a rank whose peers are late sits in that
wait. FSDP runs its own hooks at those points; the integration brackets them
with hooks of its own, registered around FSDP's (module forward pre-hooks
before and after FSDP's; gradient hooks on the module's outputs before and
after FSDP's pre-backward hook). Each bracketed interval is carved out of the
phase that holds it (``forward`` or ``backward``) into ``comm_wait``. With
CUDA timing the marks are CUDA events on the current stream, which FSDP makes
wait for the all-gather stream: GPU time, no synchronize.

Not separated: the reduce-scatter of gradients, whose wait stays inside
``backward`` (compare backward with peers, as for a plain loop).

FSDP1 (``FullyShardedDataParallel``) needs an accelerator in torch 2.13 and is
not instrumented here.
"""

from __future__ import annotations

from time import perf_counter_ns
from typing import TYPE_CHECKING, Any

from stepwatch.errors import StepwatchError
from stepwatch.integrations.torch.split import Wait, WaitSplitter
from stepwatch.sdk import StepWatch, TimingEvent

if TYPE_CHECKING:
    from stepwatch.integrations.torch import Instrumented

Mark = tuple[int, TimingEvent | None]


class Bracket:
    """Start/end marks around one FSDP hook on one module; never raises."""

    def __init__(self, sw: StepWatch, splitter: WaitSplitter) -> None:
        self.sw = sw
        self.splitter = splitter
        self.forward: Mark | None = None
        self.backward: Mark | None = None

    def mark(self) -> Mark:
        return perf_counter_ns(), self.sw.new_event()

    def close(self, started: Mark | None) -> None:
        if started is not None:
            end = self.mark()
            self.splitter.waited(Wait(started[0], end[0], started[1], end[1]))

    # forward pre-hooks: before FSDP's (prepend) and after it
    def before_forward(self, module: Any, args: Any) -> None:
        try:
            self.forward = self.mark()
        except Exception as err:
            self.splitter.error("fsdp_forward", err)

    def after_forward_pre(self, module: Any, args: Any) -> None:
        try:
            started, self.forward = self.forward, None
            self.close(started)
        except Exception as err:
            self.splitter.error("fsdp_forward", err)

    # forward hooks: put gradient hooks on the outputs before and after FSDP's pre-backward
    def outputs_first(self, module: Any, args: Any, output: Any) -> None:
        self._on_outputs(output, self._before_backward)

    def outputs_last(self, module: Any, args: Any, output: Any) -> None:
        self._on_outputs(output, self._after_backward_pre)

    def _on_outputs(self, output: Any, hook: Any) -> None:
        try:
            import torch

            if not torch.is_grad_enabled():
                return
            for t in _tensors(output):
                if t.requires_grad:
                    t.register_hook(hook)
                    return  # one output is enough: FSDP's pre-backward runs once per module
        except Exception as err:
            self.splitter.error("fsdp_backward", err)

    def _before_backward(self, grad: Any) -> Any:
        try:
            self.backward = self.mark()
        except Exception as err:
            self.splitter.error("fsdp_backward", err)
        return grad

    def _after_backward_pre(self, grad: Any) -> Any:
        try:
            started, self.backward = self.backward, None
            self.close(started)
        except Exception as err:
            self.splitter.error("fsdp_backward", err)
        return grad


def _tensors(output: Any) -> list[Any]:
    import torch

    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, list | tuple):
        return [t for t in output if isinstance(t, torch.Tensor)]
    if isinstance(output, dict):
        return [t for t in output.values() if isinstance(t, torch.Tensor)]
    return []


def instrument(model: Any, sw: StepWatch) -> Instrumented:
    from stepwatch.integrations.torch import Instrumented

    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError as err:
        raise StepwatchError(
            "instrument_fsdp needs torch.distributed.fsdp.fully_shard (FSDP2)"
        ) from err
    units: list[Any] = [m for m in model.modules() if isinstance(m, FSDPModule)]
    if not units:
        raise StepwatchError(
            "instrument_fsdp found no fully_shard module: call it after fully_shard"
        )
    splitter = WaitSplitter()
    for unit in units:
        b = Bracket(sw, splitter)
        unit.register_forward_pre_hook(b.before_forward, prepend=True)
        unit.register_forward_pre_hook(b.after_forward_pre)
        unit.register_forward_hook(b.outputs_first, prepend=True)
        unit.register_forward_hook(b.outputs_last)
    sw.add_step_hook(splitter)
    return Instrumented(sw, splitter, "fsdp")
