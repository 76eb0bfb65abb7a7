"""The demo's loop pieces: a job restarted on a new allocation, the arc, plain output."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from stepwatch.contract import DetectionMessage, EventMessage, EventType, PortMessage, StepMessage
from stepwatch.demo.allocation import Allocation, SlurmAllocation
from stepwatch.demo.arc import Arc
from stepwatch.demo.fleet import Incarnation, restart
from stepwatch.demo.plain import Changes
from stepwatch.demo.view import deciding
from stepwatch.sim import Fault, FaultKind, Scenario, simulate
from stepwatch.sim.ports import Carry

HOSTS = ("node01", "node02", "node03")
SLOW = Fault(FaultKind.SLOW_GPU, rank=13, start_step=5, severity=0.3)


def scenario(**kw: object) -> Scenario:
    base: dict[str, object] = {
        "nodes": 3,
        "steps": 40,
        "hosts": HOSTS,
        "faults": (SLOW,),
        "checkpoint_every": 10,
        "checkpoint_seconds": 1.0,
        "eval_every": 0,
    }
    return Scenario(**{**base, **kw})  # type: ignore[arg-type]


def test_a_restart_leaves_the_fault_with_its_node_and_rewinds_the_steps() -> None:
    sc = scenario()
    moved = restart(sc, ("node01", "node03", "node04"), 21)
    assert moved.faults == () and moved.first_step == 21 and moved.incarnation == 1
    kept = restart(sc, ("node04", "node02", "node05"), 21)
    assert [(f.host, f.gpu, f.start_step) for f in kept.faults] == [("node02", 5, 21)]
    messages = list(simulate(moved))
    steps = sorted({r.step for m in messages if isinstance(m, StepMessage) for r in m.steps})
    assert steps[0] == 21 and steps[-1] == 39
    events = [m for m in messages if isinstance(m, EventMessage)]
    assert [e.type for e in events[:2]] == [EventType.JOB_START, EventType.RESTART]
    assert events[1].attrs["step"] == 21


def test_nic_counters_go_on_across_a_restart_on_the_same_host() -> None:
    carry: Carry = {}
    first = [m for m in simulate(scenario(steps=12), carry=carry) if isinstance(m, PortMessage)]
    last = {m.host: m for m in first}["node01"].ports
    again = restart(scenario(steps=12), ("node01", "node03", "node04"), 0)
    later = [m for m in simulate(again, carry=carry) if isinstance(m, PortMessage)]
    head = next(m for m in later if m.host == "node01").ports
    assert [p.link_downed_total for p in head] == [p.link_downed_total for p in last]
    assert all(
        (h.xmit_bytes_total or 0) >= (p.xmit_bytes_total or 1)
        for h, p in zip(head, last, strict=True)
    )


def test_first_step_must_be_inside_the_job() -> None:
    from stepwatch.errors import ConfigError

    with pytest.raises(ConfigError):
        scenario(first_step=40)


@dataclass(frozen=True)
class Note:
    at: float
    route: str
    status: str
    alerts: tuple[str, ...]


def detection(state: str, **kw: object) -> DetectionMessage:
    base: dict[str, object] = {
        "host": "node02",
        "ts": 1.0,
        "id": "d1",
        "job_id": "1",
        "type": "straggler",
        "state": state,
        "rank": 13,
        "cause": "gpu",
        "fault": "system",
        "summary": "rank 13 is slow: SM clock below max",
    }
    return DetectionMessage(**{**base, **kw})  # type: ignore[arg-type]


def test_the_arc_goes_forward_once_with_event_times() -> None:
    arc = Arc(wall0=1000.0)
    assert [s.name for s in arc.observe(5.0, steps=8, detections=[])] == ["healthy"]
    assert [s.name for s in arc.observe(40.0, steps=90, detections=[detection("open")])] == [
        "found"
    ]
    actions = [
        {"kind": "drain", "node": "node02", "job_id": "1", "status": "done", "updated": 1061.5},
        {"kind": "requeue", "node": "node02", "job_id": "1", "status": "done", "updated": 1061.7},
    ]
    new = arc.observe(
        64.0,
        steps=99,
        detections=[detection("open")],
        notifications=[Note(1060.2, "ticket", "firing", ("StragglerPersistent",))],
        actions=actions,
    )
    assert [(s.name, s.at) for s in new] == [
        ("paged", pytest.approx(60.2)),
        ("drained", pytest.approx(61.5)),
        ("requeued", pytest.approx(61.7)),
    ]
    runs = [Incarnation(0, 1000.0, HOSTS, 0), Incarnation(1, 1075.0, ("node01", "node03"), 50)]
    resolved = [detection("open"), detection("resolved")]
    new = arc.observe(90.0, steps=150, detections=resolved, actions=actions, incarnations=runs)
    assert [s.name for s in new] == ["running again", "recovered"]
    assert arc.reached["running again"].at == pytest.approx(75.0)
    assert "node02" not in arc.reached["running again"].detail
    assert arc.observe(95.0, steps=160, detections=resolved, incarnations=runs) == []


def test_a_detection_away_from_the_faulty_node_is_not_the_fault_found() -> None:
    """The torch demo: a real host_input blip on node01 just before the fault began was
    "found", and its resolution a second later "recovered", while the injected straggler
    on node02 was still firing."""
    arc = Arc(wall0=1000.0, fault_hosts=frozenset({"node02"}))
    blip = detection("open", id="d0", host="node01", rank=1, cause="host_input")
    assert [s.name for s in arc.observe(20.0, steps=90, detections=[blip])] == ["healthy"]
    found = arc.observe(22.0, steps=95, detections=[blip, detection("open")])
    assert [s.name for s in found] == ["found"] and arc.detection_id == "d1"
    assert "host=node02" in arc.reached["found"].detail
    runs = [Incarnation(0, 1000.0, HOSTS, 0), Incarnation(1, 1060.0, ("node03", "node04"), 50)]
    arc.reach("requeued", 55.0, "requeue")
    gone = [detection("resolved", id="d0", host="node01", rank=1), detection("open")]
    assert [s.name for s in arc.observe(61.0, steps=99, detections=gone, incarnations=runs)] == [
        "running again"
    ]
    done = arc.observe(75.0, steps=99, detections=[*gone, detection("resolved")], incarnations=runs)
    assert [s.name for s in done] == ["recovered"] and "node02" in done[0].detail


@pytest.mark.parametrize(
    ("evidence", "said"),
    [
        ({}, "straggler rank 13 host=node02 cause=gpu"),
        ({"gpu_reasons": "compute"}, "straggler rank 13 host=node02 cause=gpu (compute)"),
        (
            {"host_reasons": "cpu_contention"},
            "straggler rank 13 host=node02 cause=host_input (cpu_contention)",
        ),
    ],
)
def test_the_found_stage_says_the_cause_and_its_reason(evidence: dict, said: str) -> None:  # type: ignore[type-arg]
    arc = Arc(wall0=1000.0)
    cause = "host_input" if "host_reasons" in evidence else "gpu"
    arc.observe(5.0, steps=90, detections=[detection("open", cause=cause, evidence=evidence)])
    assert arc.reached["found"].detail == said


def test_plain_output_prints_changes_only_and_a_status_now_and_then() -> None:
    changes = Changes(status_every=10.0)
    first = changes.lines(0.0, {"slurm job": "1 RUNNING"}, "steps=0")
    assert first == ["[t=   0.0s] slurm job: 1 RUNNING", "[t=   0.0s] status: steps=0"]
    assert changes.lines(2.0, {"slurm job": "1 RUNNING"}, "steps=5") == []
    assert changes.lines(4.0, {"slurm job": "1 PENDING", "alert X": "firing"}, "steps=9") == [
        "[t=   4.0s] slurm job: 1 PENDING",
        "[t=   4.0s] alert X: firing",
    ]
    assert changes.lines(10.5, {"slurm job": "1 PENDING"}, "steps=20") == [
        "[t=  10.5s] alert X: ended",
        "[t=  10.5s] status: steps=20",
    ]


def test_the_evidence_line_shows_the_deciding_numbers() -> None:
    evidence = {
        "basis": "busy",
        "flagged_steps": 12,
        "window_steps": 20,
        "threshold": 0.08,
        "group_size": 64,
        "phases_longer": "forward",
        "forward_excess": 0.09,
        "forward_s": 0.31,
        "sm_clock_ratio": 0.773,
        "peer_sm_clock_ratio": 1.0,
    }
    line = deciding(evidence)
    assert line.startswith("sm_clock_ratio=0.773, peer_sm_clock_ratio=1.0")
    assert "basis" not in line and "flagged_steps" not in line and "forward_excess=0.09" in line


def test_allocation_refuses_a_job_id_that_is_not_one() -> None:
    with pytest.raises(ValueError):
        SlurmAllocation("1; scancel -u root", {})


def _client(path: Path, out: str) -> str:
    """A stand-in Slurm client that prints ``out`` only when it runs outside the
    caller's process group (a terminal's Ctrl-C to the demo would not reach it)."""
    path.write_text(
        f"#!{sys.executable}\nimport os\n"
        f"print({out!r} if os.getpgid(0) != {os.getpgid(0)} else 'PENDING')\n"
    )
    path.chmod(0o755)
    return str(path)


def test_allocation_clients_are_out_of_reach_of_the_demos_ctrl_c(tmp_path: Path) -> None:
    """A Ctrl-C to the demo's process group must not kill ``squeue`` between its request
    and slurmctld's reply: the clients run in their own session."""
    alloc = SlurmAllocation(
        "7",
        dict(os.environ),
        squeue=_client(tmp_path / "squeue", "RUNNING node0[1-2]"),
        scontrol=_client(tmp_path / "scontrol", "node01 node02"),
    )
    assert alloc() == Allocation("RUNNING", ("node01", "node02"))


def test_the_pager_wants_the_bearer_token() -> None:
    import json
    import urllib.error
    import urllib.request

    from stepwatch.demo.pager import Pager

    pager = Pager("s3cret").start()
    body = json.dumps({"status": "firing", "alerts": [{"labels": {"alertname": "X"}}]}).encode()
    try:

        def post(token: str) -> int:
            req = urllib.request.Request(
                f"{pager.url}/ticket",
                data=body,
                method="POST",
                headers={"Authorization": f"Bearer {token}"},
            )
            try:
                with urllib.request.urlopen(req, timeout=5) as resp:
                    return int(resp.status)
            except urllib.error.HTTPError as err:
                return err.code

        assert post("wrong") == 401 and pager.refused == 1 and pager.notifications() == []
        assert post("s3cret") == 200
        [note] = pager.notifications()
        assert (note.route, note.status, note.alerts) == ("ticket", "firing", ("X",))
    finally:
        pager.stop()


def test_a_job_stops_when_its_allocation_changes_not_when_slurm_is_silent() -> None:
    from stepwatch.demo.allocation import UNKNOWN, Allocation, lost

    hosts = ("node01", "node02")
    assert not lost(Allocation("RUNNING", hosts), hosts)
    assert not lost(Allocation(UNKNOWN), hosts)  # no answer: nothing is known
    assert lost(Allocation("PENDING"), hosts) and lost(Allocation("GONE"), hosts)
    assert lost(Allocation("RUNNING", ("node01", "node03")), hosts)


def test_the_torch_job_keeps_its_fault_on_its_node_and_resumes_after_the_first_run(
    tmp_path,
) -> None:  # type: ignore[no-untyped-def]
    from types import SimpleNamespace

    from stepwatch.demo.torchjob import TorchJob
    from stepwatch.settings import Settings

    job = TorchJob(
        Settings.load(env={}), tmp_path, "7", SimpleNamespace(steps=300), hosts=("node01", "node02")
    )

    def arg(argv: list[str], name: str) -> str | None:
        return argv[argv.index(name) + 1] if name in argv else None

    first = job.argv(("node01", "node02"))
    assert arg(first, "--slow-rank") == "3" and arg(first, "--host-names") == "node01,node02"
    assert "--resume" not in first and arg(first, "--job-id") == "7"
    job.incarnations.append(Incarnation(0, 0.0, ("node01", "node02"), 0))
    moved = job.argv(("node02", "node03"))  # the slow node is now the job's first
    assert arg(moved, "--slow-rank") == "1" and arg(moved, "--resume") == str(job.checkpoints)
    assert "--slow-rank" not in job.argv(("node01", "node03"))  # a new node is a healthy one
    assert job.checkpoint_step() == 0
    job.checkpoints.mkdir()
    (job.checkpoints / "checkpoint.json").write_text('{"step": 75}\n')
    assert job.checkpoint_step() == 75


def test_the_torch_jobs_count_is_read_after_its_agents_stopped_and_flushed(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from types import SimpleNamespace

    from stepwatch.demo.services import Child
    from stepwatch.demo.torchjob import TorchJob
    from stepwatch.settings import Settings

    job = TorchJob(Settings.load(env={}), tmp_path, "7", SimpleNamespace(steps=300))
    for host, messages, left in (("node01", 405, 0), ("node02", 407, 2)):
        log = tmp_path / f"agent-{host}.log"
        log.write_text(
            'ts=1 level=INFO logger=stepwatch.agents.agent msg="agent stopping host=x"\n'
            f'ts=2 level=INFO logger=stepwatch.agents.agent msg="agent stopped host={host} '
            f'ticks=9 messages={messages} steps_received=300 undelivered_in_spool={left}"\n'
        )
        job.agents.append(Child(f"agent-{host}", ["true"], log))
    job._sent = 808  # the count the agents' /metrics gave before their last flush
    job.stop()
    assert job.sent == 810


def test_an_outcome_says_when_its_action_ran_in_utc(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from typing import Any, cast

    from stepwatch.alerts.remediate.model import ActionKind, Alert, Mode
    from stepwatch.alerts.remediate.outcome import OutcomeTracker
    from stepwatch.alerts.remediate.policy import OutcomeSettings
    from stepwatch.alerts.remediate.state import State

    now = [1795690395.0]
    audit = SimpleAudit()
    tracker = OutcomeTracker(
        State(tmp_path / "state"),
        OutcomeSettings(settle_s=0.0),
        cast(Any, None),
        cast(Any, audit),
        mode=Mode.EXECUTE,
        clock=lambda: now[0],
    )
    alert = Alert("f1", "firing", {"alertname": "StragglerPersistent", "host": "node02"})
    tracker.acted(alert, ActionKind.DRAIN)
    now[0] += 42
    [decision] = tracker.resolved(Alert("f1", "resolved", alert.labels))
    assert decision.detail == "drain at 2026-11-26T10:53:15Z, 42 s later", decision.detail


class SimpleAudit:
    def __init__(self) -> None:
        self.records: list[object] = []

    def record(self, decision: object) -> None:
        self.records.append(decision)
