"""DDP: a communication hook that marks each step's last gradient all-reduce.

``register_comm_hook`` gives a hook per gradient bucket; the wrapper records
when the bucket was launched (``perf_counter_ns``, plus a CUDA event on the
current stream for the last bucket when the SDK times with CUDA events) and,
from the bucket's future, how long its all-reduce took (wall time; meaningful
with gloo, where the future completes when the reduction does). It then calls
the real hook (DDP's default all-reduce unless you give your own). Per-bucket
timing (``time_buckets=True``) chains a Python callback on each bucket's
future, so it is off by default. Nothing
here synchronizes the device or waits on a future.
"""

from __future__ import annotations

from collections.abc import Callable
from time import perf_counter_ns
from typing import Any

from stepwatch.integrations.torch.split import WaitSplitter
from stepwatch.sdk import StepWatch

Hook = Callable[[Any, Any], Any]  # (state, GradBucket) -> Future[Tensor]


def default_hook() -> tuple[Hook, Any]:
    """DDP's default: average the bucket over the process group (``state``=None: world)."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    return allreduce_hook, None


def timed_hook(
    sw: StepWatch, splitter: WaitSplitter, inner: Hook, time_buckets: bool = False
) -> Hook:
    """A DDP comm hook that marks the launch of each step's last bucket and times
    every bucket's future, then forwards to ``inner``. A failure of the timing is
    caught and counted; one of ``inner`` (the real all-reduce) propagates, as it
    would without stepwatch."""

    def done_after(start: int) -> Callable[[Any], Any]:
        def done(f: Any) -> Any:
            try:
                splitter.comm_done((perf_counter_ns() - start) / 1e9)
            except Exception as err:
                splitter.error("comm_done", err)
            return f.value()  # the reduced tensor, as DDP expects; re-raises a comm error

        return done

    # unannotated on purpose: DDP checks that a hook's `bucket` annotation, if any,
    # is dist.GradBucket and its return annotation Future[Tensor]
    # (the type comment types it for mypy and adds no annotation at run time)
    def stepwatch_timed_hook(state, bucket):  # type: (Any, Any) -> Any
        start = perf_counter_ns()
        try:
            if bucket.is_last():
                splitter.launched(start, sw.new_event())
        except Exception as err:
            splitter.error("launch_mark", err)
        fut = inner(state, bucket)
        if not time_buckets:
            return fut
        try:
            return fut.then(done_after(start))
        except Exception as err:
            splitter.error("future_then", err)
            return fut

    return stepwatch_timed_hook
