"""stepwatch: observability for distributed training.

``import stepwatch`` gives the step SDK a training script uses (see docs/sdk.md)::

    sw = stepwatch.init()
    with sw.step(samples=32, tokens=32 * 4096) as s:
        with s.phase("forward"):
            ...

The SDK is imported on first use of one of its names, so pipeline processes
importing ``stepwatch.contract`` (say) do not load it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_SDK_NAMES = ("Identity", "Step", "StepWatch", "detect_identity", "init")

if TYPE_CHECKING:
    from stepwatch.sdk import Identity, Step, StepWatch, detect_identity, init

__all__ = ["Identity", "Step", "StepWatch", "__version__", "detect_identity", "init"]


def __getattr__(name: str) -> Any:
    if name in _SDK_NAMES:
        from stepwatch import sdk

        return getattr(sdk, name)
    raise AttributeError(f"module 'stepwatch' has no attribute {name!r}")
