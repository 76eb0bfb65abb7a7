"""Discrete rank events: exceptions in user code, checkpoints, custom events.

Built as wire ``RankEvent`` datagrams (``{"kind": "rank_event", ...}``). These
are rare, so they are built on the calling thread; sending stays on the
sender thread.
"""

from __future__ import annotations

import math
import re
import time
from typing import Any

from stepwatch.contract.records import EventType, plain_name, plain_text
from stepwatch.contract.wire import RankEvent
from stepwatch.sdk.identity import Identity

MAX_TEXT = 1024  # characters of an exception message kept (datagrams stay small)
OOM = "OOM"
_OOM_CLASSES = {"OutOfMemoryError", "MemoryError"}
_OOM_TEXT = ("CUDA out of memory", "CUDA error: out of memory")

AttrValue = str | float | int | bool
_SURROGATE = re.compile("[\ud800-\udfff]")


def is_oom(exc: BaseException) -> bool:
    """torch.cuda.OutOfMemoryError (or torch.OutOfMemoryError, MemoryError), or a
    RuntimeError saying "CUDA out of memory". torch is not imported."""
    if any(cls.__name__ in _OOM_CLASSES for cls in type(exc).__mro__):
        return True
    text = str(exc)
    return any(marker in text for marker in _OOM_TEXT)


def exception_event(identity: Identity, exc: BaseException, step: int | None) -> RankEvent:
    """``detail`` is ``"OOM"`` for out-of-memory errors, else the exception's class name."""
    cls = type(exc)
    oom = is_oom(exc)
    attrs: dict[str, AttrValue] = {
        "exception": f"{cls.__module__}.{cls.__qualname__}",
        "message": str(exc)[:MAX_TEXT],
        "oom": oom,
    }
    if step is not None:
        attrs["step"] = step
    return _event(identity, EventType.EXCEPTION, OOM if oom else cls.__name__, attrs)


def checkpoint_event(
    identity: Identity, load: bool, duration: float, start: float, step: int | None, path: str = ""
) -> RankEvent:
    attrs: dict[str, AttrValue] = {"duration_s": duration, "start": start}
    if step is not None:
        attrs["step"] = step
    if path:
        attrs["path"] = path[:MAX_TEXT]
    kind = EventType.CHECKPOINT_LOAD if load else EventType.CHECKPOINT_SAVE
    return _event(identity, kind, "load" if load else "save", attrs)


def checkpoint_begin_event(
    identity: Identity, load: bool, start: float, step: int | None, path: str = ""
) -> RankEvent:
    """Sent as a checkpoint begins (``sw.checkpoint``): the hang checks allow for it until
    the job steps again (its end is the ``checkpoint_save``/``checkpoint_load``)."""
    attrs: dict[str, AttrValue] = {"start": start}
    if step is not None:
        attrs["step"] = step
    if path:
        attrs["path"] = path[:MAX_TEXT]
    return _event(identity, EventType.CHECKPOINT_BEGIN, "load" if load else "save", attrs)


def job_start_event(identity: Identity, timing: str, restarts: int | None) -> RankEvent:
    """Sent by rank 0 at ``init``: the stream processors learn the job's world size."""
    attrs: dict[str, AttrValue] = {
        "world_size": identity.world_size,
        "local_world_size": identity.local_world_size,
        "launcher": identity.launcher.value,
        "timing": timing,
    }
    if restarts is not None:
        attrs["restart_count"] = restarts
    return _event(identity, EventType.JOB_START, "started", attrs)


INTERRUPTED_CODE = 130  # a shell's code for a process ended by SIGINT (128 + 2)


def job_end_event(identity: Identity, error: str | None, step: int | None) -> RankEvent:
    """Sent by rank 0 at ``close``: ``code`` 0 and ``finished``, 130 and ``interrupted:
    KeyboardInterrupt`` (a Ctrl-C, a SIGINT: stopped, not failed), or 1 and ``error:
    <class>``."""
    attrs: dict[str, AttrValue] = {} if step is None else {"last_step": step}
    if error is None:
        return _event(identity, EventType.JOB_END, "finished", attrs, code=0)
    if error == "KeyboardInterrupt":
        return _event(
            identity, EventType.JOB_END, f"interrupted: {error}", attrs, code=INTERRUPTED_CODE
        )
    return _event(identity, EventType.JOB_END, f"error: {error}", attrs, code=1)


def custom_event(
    identity: Identity, kind: EventType, detail: str, attrs: dict[str, Any]
) -> RankEvent:
    return _event(identity, kind, str(detail)[:MAX_TEXT], dict(attrs))


def _attr(value: Any) -> AttrValue:
    """A value the wire carries as it is: a non-finite float as its name (JSON has no NaN:
    it went as null, which the agent refused, and the whole event with it), text without
    what no encoder writes (a lone surrogate: the event was lost at encode)."""
    if isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)  # 'nan', 'inf', '-inf'
    return _SURROGATE.sub("\ufffd", value if isinstance(value, str) else str(value))[:MAX_TEXT]


def _event(
    identity: Identity,
    kind: EventType,
    detail: str,
    attrs: dict[str, AttrValue],
    code: int | None = None,
) -> RankEvent:
    return RankEvent(
        type=kind,
        ts=time.time(),
        job_id=identity.job_id,
        rank=identity.rank,
        gpu=identity.gpu if identity.gpu is not None else identity.local_rank,
        detail=plain_text(detail),  # colour codes and the like: kept as U+FFFD, not refused
        attrs={plain_name(str(k))[:64]: _attr(v) for k, v in attrs.items()},
        code=code,
    )
