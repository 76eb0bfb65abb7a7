"""``stepwatch.init()``: identity, timing source, sender and optional OTel, wired up.

Every knob follows explicit argument > ``STEPWATCH_*`` env var > default:

* ``STEPWATCH_ENABLED`` (default on): off gives a StepWatch that records nothing;
* ``STEPWATCH_AGENT_SOCKET`` (via :class:`stepwatch.settings.Settings`);
* ``STEPWATCH_TIMING``: ``auto`` (CUDA events when torch with CUDA is already
  imported, else wall time), ``wall`` or ``cuda``;
* ``STEPWATCH_OTEL``: build OTel spans on the global TracerProvider;
* ``STEPWATCH_CPU_WAIT`` (default on): report each step's CPU time and run-queue
  wait (``cpu_time``, ``cpu_wait``, see :mod:`stepwatch.sdk.cpuwait`);
* identity variables, see :mod:`stepwatch.sdk.identity`.

``init`` never raises: whatever fails, it logs and returns a StepWatch that
drops what it cannot send.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Mapping
from typing import Any

from stepwatch.contract.records import StepRecord
from stepwatch.contract.wire import RankStep, decode_datagram, encode_datagram
from stepwatch.errors import ContractError
from stepwatch.sdk.client import StepWatch, hand_over_live, handles_locked
from stepwatch.sdk.cpuwait import SchedStat
from stepwatch.sdk.cuda import EventFactory, EventPool, torch_event_factory
from stepwatch.sdk.identity import Identity, detect_identity
from stepwatch.sdk.otel import SpanBuilder
from stepwatch.sdk.resolve import Resolver
from stepwatch.sdk.sender import BackgroundSender, InlineSender, Sender, _Processor
from stepwatch.sdk.transport import DatagramSender
from stepwatch.settings import Settings

logger = logging.getLogger(__name__)


def _off(identity: Identity, start_step: int) -> StepWatch:
    """A handle that reports nothing; the earlier handles it replaces in this process
    (:func:`hand_over_live`) are closed first."""
    with handles_locked():
        off = StepWatch(identity, None, start_step=start_step)
        try:
            hand_over_live(1.0, "", off)
        except Exception as err:  # never into training
            logger.warning("stepwatch sdk: the earlier handle did not close err=%r", err)
    return off


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def init(
    job_id: str | None = None,
    *,
    rank: int | None = None,
    world_size: int | None = None,
    local_rank: int | None = None,
    host: str | None = None,
    gpu: int | None = None,
    group: str | None = None,
    agent_socket: str | None = None,
    settings: Settings | None = None,
    timing: str | None = None,
    event_factory: EventFactory | None = None,
    tracer_provider: Any = None,
    otel: bool | None = None,
    background: bool = True,
    queue_size: int = 4096,
    flush_interval: float = 0.05,
    start_step: int = 0,
    job_events: bool = True,
    enabled: bool | None = None,
    cpu_wait: bool | None = None,
    env: Mapping[str, str] | None = None,
) -> StepWatch:
    """Start the step SDK for this process (see docs/sdk.md)."""
    environ = os.environ if env is None else env
    identity = _identity(
        environ,
        job_id=job_id,
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        host=host,
        gpu=gpu,
        group=group,
    )
    try:
        if not _flag(enabled, environ, "STEPWATCH_ENABLED", default=True):
            logger.info("stepwatch sdk: disabled (STEPWATCH_ENABLED)")
            return _off(identity, start_step)
        if _importing_parents_main():  # not the rank: its worker (spawn, forkserver)
            logger.info("stepwatch sdk: off in a multiprocessing child importing the main module")
            return _off(identity, start_step)
        refused = _refused_identity(identity)
        if refused:  # the agent would refuse every record: say so once, cost nothing
            logger.warning("stepwatch sdk: off, the agent refuses this identity: %s", refused)
            return _off(identity, start_step)
        factory = _event_factory(timing, event_factory, environ)
        pool = EventPool(factory) if factory is not None else None
        spans = _span_builder(otel, tracer_provider, environ)
        path = _socket_path(agent_socket, settings, environ)
        processor = _Processor(DatagramSender(path), Resolver(), spans, pool)
        sender: Sender
        if background or pool is not None or spans is not None:
            sender = BackgroundSender(processor, queue_size, flush_interval)
        else:
            sender = InlineSender(processor)
        sched = (
            SchedStat() if _flag(cpu_wait, environ, "STEPWATCH_CPU_WAIT", default=True) else None
        )
        with handles_locked():  # two threads' inits: one replaces the other, never both off
            sw = StepWatch(
                identity,
                sender,
                pool=pool,
                timing="cuda" if pool else "wall",
                start_step=start_step,
                sched=sched,
            )
            # a second init replaces the first (not another rank of the same job): its
            # sender stops, the job it announced goes on
            if not hand_over_live(1.0, identity.job_id if job_events else "", sw) and job_events:
                sw.announce(_restarts(environ))
    except Exception as err:
        logger.warning("stepwatch sdk: setup failed, steps will not be reported err=%r", err)
        return _off(identity, start_step)
    logger.info(
        "stepwatch sdk: started job_id=%s rank=%s world_size=%s host=%s gpu=%s "
        "launcher=%s timing=%s socket=%s otel=%s",
        identity.job_id,
        identity.rank,
        identity.world_size,
        identity.host,
        identity.gpu,
        identity.launcher.value,
        sw.timing,
        path,
        spans is not None,
    )
    return sw


def _importing_parents_main() -> bool:
    """True while a ``spawn``/``forkserver`` child of multiprocessing (a DataLoader worker,
    a Pool) imports the parent's main module as ``__mp_main__``: a module-level ``init``
    there is the rank's, run again under its identity (multiprocessing's own check for a
    child that starts a process at import looks at the same flag)."""
    mp = sys.modules.get("multiprocessing.process")
    try:
        return mp is not None and bool(getattr(mp.current_process(), "_inheriting", False))
    except Exception:  # never into training
        return False


def _refused_identity(identity: Identity) -> str:
    """Why the agent would refuse every step of ``identity`` ("" when it would not): a job
    id, host or group over 256 characters or with a control character, a GPU index over
    65535 (the agent's own decoder says)."""
    now = time.time()
    probe = StepRecord(
        job_id=identity.job_id,
        rank=identity.rank,
        world_size=identity.world_size,
        step=0,
        start=now,
        end=now,
        host=identity.host,
        local_rank=identity.local_rank,
        gpu=identity.gpu,
        group=identity.group,
    )
    try:
        decode_datagram(encode_datagram(RankStep(step=probe)))
    except ContractError as err:
        return str(err)
    except Exception as err:  # never into training: an identity that cannot even be encoded
        return repr(err)
    return ""


def _identity(environ: Mapping[str, str], **explicit: Any) -> Identity:
    try:
        return detect_identity(environ, **explicit)
    except Exception as err:
        logger.warning("stepwatch sdk: identity detection failed err=%r", err)
        return Identity()


def _restarts(environ: Mapping[str, str]) -> int | None:
    """torchrun's restart count (elastic restarts of the worker group)."""
    raw = environ.get("TORCHELASTIC_RESTART_COUNT", "")
    return int(raw) if raw.isdigit() else None


def _flag(explicit: bool | None, environ: Mapping[str, str], var: str, default: bool) -> bool:
    if explicit is not None:
        return bool(explicit)
    raw = environ.get(var, "").strip().lower()
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    if raw:
        logger.warning("stepwatch sdk: ignoring %s=%r (not a boolean)", var, raw)
    return default


def _event_factory(
    timing: str | None, factory: EventFactory | None, environ: Mapping[str, str]
) -> EventFactory | None:
    choice = (timing or environ.get("STEPWATCH_TIMING") or "auto").strip().lower()
    if choice not in {"auto", "wall", "cuda"}:
        logger.warning("stepwatch sdk: timing=%r is not auto|wall|cuda; using auto", choice)
        choice = "auto"
    if choice == "wall":
        return None
    found = factory if factory is not None else torch_event_factory()
    if found is None and choice == "cuda":
        logger.warning(
            "stepwatch sdk: timing=cuda but torch with CUDA is not in use; using wall time"
        )
    return found


def _span_builder(
    otel: bool | None, provider: Any, environ: Mapping[str, str]
) -> SpanBuilder | None:
    if not _flag(otel, environ, "STEPWATCH_OTEL", default=provider is not None):
        return None
    try:
        return SpanBuilder(provider)
    except Exception as err:  # opentelemetry missing or a provider without get_tracer
        logger.warning(
            "stepwatch sdk: OpenTelemetry spans disabled (pip install "
            "'stepwatch[otel]' for spans) err=%r",
            err,
        )
        return None


def _socket_path(
    explicit: str | None, settings: Settings | None, environ: Mapping[str, str]
) -> str:
    if explicit:
        return str(explicit)
    if settings is not None:
        return settings.agent_socket
    try:
        return Settings.load(env=environ).agent_socket
    except Exception as err:  # garbage in unrelated STEPWATCH_* settings
        logger.warning(
            "stepwatch sdk: settings unreadable err=%s; using the agent socket "
            "from STEPWATCH_AGENT_SOCKET or the default",
            err,
        )
        return environ.get("STEPWATCH_AGENT_SOCKET") or Settings.agent_socket
