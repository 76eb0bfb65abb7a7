"""A rank whose process died, and the exceptions its peers raise because of it.

When a rank's process dies (killed, a segfault, the kernel's OOM killer) its peers
fail in their next collective: gloo raises "Connection closed by peer", NCCL aborts
its communicator or its watchdog times out, torch raises ``DistBackendError``.
Those exceptions are not errors in user code. In a real two-node ``torchrun`` job
whose rank 2 was killed, rank 1's ``RuntimeError: ... Connection closed by peer``
was reported as the job's ``user_error`` (notify the owner, never look at the
node), and the node whose rank died was named nowhere.

Two facts fix that:

* :func:`is_peer_failure`: an exception that says a peer or the transport failed
  (by class, or by the text of gloo, NCCL and torch.distributed) never opens a
  ``user_error``, and a rank's stop is never put down to it;
* ``rank_exit``: the node agent watches each rank process that sent it steps and
  says when one ends without the SDK's ``job_end`` (``stepwatch.agents.collectors.exits``).

The rank that exited first (with any that exited within :data:`TOGETHER_S` of it
on another host, or at the same instant on its own) is ``rank_missing`` when
something says it died rather than was stopped: the kernel says it was killed
and the ranks after it were stopped (the agent's ``signal`` / ``exit_code``,
:func:`killed_first`), a peer failed after it, or, every rank having ended and
one rank first alone (not with exit code 0), every rank on other hosts ended at
least :data:`LEAD_SECONDS` after it (NCCL peers abort without a Python
exception). It is judged once the exits had :data:`EXIT_SETTLE_SECONDS` to come
in, at the job's end, or before a restart; and at the hang limit while at most
half the ranks have ended (``how="exited"``). Exit times are compared on one
clock (:meth:`HostClocks.in_order`). Without the kernel's word, nobody is named
when every rank ended within :data:`TOGETHER_JOB_S` of the first, nor when more
than half ended together: a cancel or a time limit stops every host at once,
and a peer's error races its own end. An exit alone opens nothing: only rank 0
sends ``job_end``, so every other rank of a job that ends well exits without one.
When every rank's process has ended, the job has: a job cancelled or killed at
its time limit sends no ``job_end``, and was called hung a minute later.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping, Sequence

from stepwatch.contract import EventMessage

# exception classes (the last part of the SDK's ``exception`` attribute) that are the
# transport's or a peer's failure
PEER_FAILURE_CLASSES = frozenset(
    {"DistBackendError", "DistNetworkError", "DistStoreError", "DistError"}
)
# what gloo, NCCL and torch.distributed say when a peer is gone (lower case)
# ... only in the words of the collective's transport (a data loader's own "connection
# reset by peer" from S3 or HTTP is the user's)
TRANSPORT_TEXT = ("gloo", "nccl", "c10d", "processgroup", "torch.distributed")
PEER_FAILURE_TEXT = (
    "connection closed by peer",
    "connection reset by peer",
    "broken pipe",
    "nccl communicator was aborted",
    "ncclremoteerror",
    "ncclsystemerror",
    "remote process exited",
    "watchdog caught collective operation timeout",
    "socket timeout",
    "for recv operation to complete",
    "for send operation to complete",
)
# exits on other hosts this close to the first are the same event: hosts' clocks are
# compared through offsets, so which of two came first is not known that finely
TOGETHER_S = 0.05
# on one host the agent stamps every exit on one clock as it wakes: an exit later than
# another there by more than this came after it (torchrun stops a dead rank's node
# mates within its 0.1 s monitor interval: one 36 ms later was named with the rank)
SAME_INSTANT_S = 0.001
# the engine's clock from a job's first exit until the exits count as in: other hosts'
# agents tell theirs a tick and a half second later, plus transport
EXIT_SETTLE_SECONDS = 3.0
# every rank of other hosts ended at least this long after the first: it died alone
# (host clocks are read to the second, but their offsets count for less than 5 s only
# through the job's own steps: a margin for what those miss)
LEAD_SECONDS = 10.0
# every rank ended within this of the first: the job was stopped (a cancel, a time
# limit reaches every host within a second), whatever a peer raised meanwhile
TOGETHER_JOB_S = 1.0


def is_peer_failure(ev: EventMessage) -> bool:
    """Whether an ``exception`` event says a peer or the collective's transport failed,
    not user code: a torch.distributed error class, or a failure text of gloo, NCCL or
    c10d that names its transport."""
    name = str(ev.attrs.get("exception", "")).rsplit(".", 1)[-1]
    if name in PEER_FAILURE_CLASSES or ev.detail in PEER_FAILURE_CLASSES:
        return True
    text = str(ev.attrs.get("message", "")).lower()
    return any(t in text for t in TRANSPORT_TEXT) and any(m in text for m in PEER_FAILURE_TEXT)


def first_exits(exits: dict[int, float], host_of: Sequence[str]) -> list[int]:
    """The ranks that exited first: on each host whose earliest exit is within
    TOGETHER_S of the job's earliest, the ranks that ended at that host's first
    instant (one host's stamps share a clock, so its later exits came after)."""
    if not exits:
        return []
    first = min(exits.values())
    earliest: dict[str, float] = {}
    for r, t in exits.items():
        earliest[host_of[r]] = min(t, earliest.get(host_of[r], t))
    return sorted(
        r
        for r, t in exits.items()
        if earliest[host_of[r]] - first <= TOGETHER_S and t - earliest[host_of[r]] <= SAME_INSTANT_S
    )


# signals a rank dies of by itself or by the kernel: a crash (segfault, bus error, a
# bad instruction) or a kill (the OOM killer, ``kill -9``). Not SIGABRT: NCCL's
# watchdog aborts the healthy ranks when a collective times out (an effect, not a
# cause). Linux's numbers, which the agent reports.
FATAL_SIGNALS = frozenset({4, 7, 8, 9, 11, 31})  # ILL, BUS, FPE, KILL, SEGV, SYS
KILLED, STOPPED, FAILED, CLEAN = "killed", "stopped", "failed", "clean"


def ended_how(ev: EventMessage) -> tuple[str, int]:
    """How a ``rank_exit``'s process ended, from the agent's ``signal`` or ``exit_code``
    (read from /proc before its parent reaped it): KILLED by a fatal signal, STOPPED
    by another (a launcher's SIGTERM, NCCL's abort), FAILED with a non-zero code,
    CLEAN with 0; ("", 0) when the agent could not tell."""
    sig, code = ev.attrs.get("signal"), ev.attrs.get("exit_code")
    if isinstance(sig, int) and not isinstance(sig, bool) and 0 < sig < 128:
        return (KILLED if sig in FATAL_SIGNALS else STOPPED), sig
    if isinstance(code, int) and not isinstance(code, bool) and 0 <= code < 256:
        return (FAILED if code else CLEAN), code
    return "", 0


def killed_first(first: Sequence[int], how: Mapping[int, tuple[str, int]]) -> list[int]:
    """The ranks among those that exited first that were killed (a fatal signal), when
    the kernel tells a crash and its launcher's teardown: the others among the first
    were stopped or failed (a launcher's SIGTERM on another host within 50 ms), and
    every later rank whose agent could tell was too (at least one). [] when a later
    one was killed too (a whole job killed: ``scancel -s KILL``, a cgroup's OOM
    kill), ended cleanly (a rank that segfaults in its exit handlers as the job
    finishes), or one of the first cannot be told."""
    killed = [r for r in first if how.get(r, ("", 0))[0] == KILLED]
    if not killed:
        return []
    if any(how.get(r, ("", 0))[0] not in (STOPPED, FAILED) for r in first if r not in killed):
        return []
    told = [k for r, (k, _) in how.items() if r not in killed and k]
    if not told or any(k not in (STOPPED, FAILED) for k in told):
        return []
    return killed


def failed_first(first: Sequence[int], how: Mapping[int, tuple[str, int]]) -> list[int]:
    """The ranks among those that exited first that failed (a non-zero exit code), when
    every other rank whose agent could tell was stopped by a signal after them (at least
    one): a launcher's teardown (``torchrun``, ``mp.spawn``) when one worker exits with
    an error. Without it, a rank that left with ``os._exit(3)`` (or a library's
    ``exit(1)``, no exception the SDK could see) while its launcher terminated the rest
    within 35 ms was named nowhere: every rank ended within a second, and no rank was
    killed. [] when another one failed too (every rank erroring out: peers' gloo errors,
    a cancel whose handlers exit non-zero), was killed, ended cleanly, or one of the
    first cannot be told."""
    failed = [r for r in first if how.get(r, ("", 0))[0] == FAILED]
    if not failed:
        return []
    if any(how.get(r, ("", 0))[0] != STOPPED for r in first if r not in failed):
        return []
    told = [k for r, (k, _) in how.items() if r not in failed and k]
    if not told or any(k != STOPPED for k in told):
        return []
    return failed


def exit_words(how: tuple[str, int] | None) -> tuple[str, dict[str, str | int]]:
    """How a process ended, as a predicate ("was killed by SIGKILL") and as evidence
    ("", {} when unknown)."""
    kind, number = how or ("", 0)
    if kind in (KILLED, STOPPED):
        name = signal_name(number)
        return f"was killed by {name}", {"signal": name}
    if kind in (FAILED, CLEAN):
        return f"exited with code {number}", {"exit_code": number}
    return "", {}


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
