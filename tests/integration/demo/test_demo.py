"""The README's main job, end to end: ``make demo`` on its embedded defaults.

``test_make_demo_closes_the_loop`` runs exactly what the README says, ``make
demo`` (bounded with ``ARGS="--duration ..."``), in a copy of the repository,
so the default relative workdir (``var/demo``) is the one the daemons get. It
waits for the whole arc (found, paged, drained, requeued, running again,
recovered), presses Ctrl-C the way a terminal does (SIGINT to the foreground
process group), then checks that every process the demo started is gone and
that no daemon logged an error.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import paths

pytestmark = pytest.mark.serial  # timing-sensitive: run alone (scripts/test.sh)

REPO = paths.ROOT
STAGES = ("HEALTHY", "FOUND", "PAGED", "DRAINED", "REQUEUED", "RUNNING AGAIN", "RECOVERED")
# What no daemon log of a healthy demo may hold.
BAD = re.compile(
    r"(?:code[= ]|status code )401\b|401 Unauthorized|no such file|"
    r"Notify for alerts failed|Traceback|level=error|\berror:",
    re.IGNORECASE,
)
# Known and harmless: slurmctld's first start has no saved state yet (it says so as an
# error), and a job cancelled when the demo stops (or requeued) is logged as one by slurmd.
KNOWN = re.compile(
    r"Could not open \w+ state file|Trying backup state save file|"
    r"\*\*\* JOB \d+ ON \w+ CANCELLED|"
    # slurmctld times its clock at start; a busy machine's is "slow" (an error)
    r"High latency for \d+ calls to gettimeofday"
)
DEMO_PROCESSES = (
    "slurmctld",
    "slurmd",
    "slurmstepd",
    "sleep",
    "tansu",
    "prometheus",
    "alertmanager",
    "munged",
    "stepwatch",
)


def _copy_repo(dst: Path) -> Path:
    ignore = shutil.ignore_patterns(".git", ".venv", "var", "*_cache", "__pycache__", "*.egg-info")
    shutil.copytree(REPO, dst, ignore=ignore)
    (dst / ".venv").symlink_to(Path(sys.prefix))
    return dst


def _outcome_supported() -> bool:
    from stepwatch.demo.alerting import outcomes_supported

    return outcomes_supported()


def _demo_processes(root: Path) -> set[int]:
    """Live processes whose command line or environment names this copy of the repository."""
    mark = str(root).encode()
    out = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                continue
            seen = (proc / "cmdline").read_bytes() + (proc / "environ").read_bytes()
        except (OSError, IndexError):
            continue
        if mark in seen:
            out.add(int(proc.name))
    return out


def _stage_lines(out: str) -> dict[str, str]:
    found = {}
    for line in out.splitlines():
        m = re.match(r"\[t=\s*([\d.]+)s\] == ([A-Z ]+) ==: (.*)", line)
        if m:
            found.setdefault(m.group(2), f"{m.group(1)} s {m.group(3)}")
    return found


def _needs_the_loop(*tools: str) -> None:
    from stepwatch.daemons.slurm import missing_binaries

    if missing_binaries() or os.geteuid() != 0 or not all(shutil.which(t) for t in tools):
        pytest.skip("needs root, Slurm and munge (bash scripts/setup.sh) for the whole loop")


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _run_to_the_end(
    argv: list[str], root: Path, want: list[str], limit: float
) -> tuple[str, set[int], float]:
    """Run ``argv`` in ``root`` until every stage of ``want`` printed (or ``limit`` s), then
    press Ctrl-C; its whole output, the processes it ran at HEALTHY, the loop's seconds."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPWATCH_")}
    env["PYTHONPATH"] = str(root)
    started = time.monotonic()
    # Ctrl-C acts as in a terminal even when this test runs where SIGINT is ignored (a
    # non-interactive shell's background job): the demo starts with SIGINT's default action
    proc = subprocess.Popen(
        argv,
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=_default_sigint,
    )
    out, running = "", set()
    assert proc.stdout is not None
    for line in proc.stdout:
        out += line
        if "== HEALTHY ==" in line:
            running = _demo_processes(root)
        if all(f"== {s} ==" in out for s in want) or time.monotonic() - started > limit:
            break
    loop_s = time.monotonic() - started
    os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C
    rest, _ = proc.communicate(timeout=120)
    return out + rest, running, loop_s


def _nothing_left_and_no_errors(root: Path) -> Path:
    """Every process of the run is gone and no daemon logged an error; the workdir."""
    time.sleep(1)
    left = _demo_processes(root)
    assert not left, "left running: " + ", ".join(
        Path(f"/proc/{p}/cmdline").read_text().replace("\0", " ")[:80]
        for p in left
        if Path(f"/proc/{p}").exists()
    )
    workdir = root / "var" / "demo"
    assert (workdir / "alerting" / "alertmanager" / "alertmanager.yml").exists()
    bad = [
        f"{log.relative_to(workdir)}: {line.strip()[:200]}"
        for log in sorted(workdir.rglob("*"))
        if log.suffix in (".log", ".out") and log.is_file()
        for line in log.read_text(errors="replace").splitlines()
        if BAD.search(line) and not KNOWN.search(line)
    ]
    assert not bad, "\n".join(bad[:30])
    return workdir


@pytest.mark.timeout(420)
def test_make_demo_closes_the_loop(tmp_path) -> None:
    _needs_the_loop("make")
    root = _copy_repo(tmp_path / "repo")
    want = [*STAGES, "OUTCOME"] if _outcome_supported() else list(STAGES)
    out, running, loop_s = _run_to_the_end(["make", "demo", "ARGS=--duration 300"], root, want, 280)
    stages = _stage_lines(out)
    assert all(s in stages for s in want), f"after {loop_s:.0f} s: {stages}\n{out[-4000:]}"
    print(
        f"\nmake demo: the loop closed in {loop_s:.0f} s; "
        + "; ".join(f"{k.lower()} {v}" for k, v in stages.items())
    )
    assert "cause=gpu" in stages["FOUND"] and "host=node02" in stages["FOUND"], stages
    assert "drain node02" in stages["DRAINED"], stages
    again = stages["RUNNING AGAIN"]
    assert "node02" not in again and "from step" in again, stages
    assert "straggler resolved" in stages["RECOVERED"], stages
    if "OUTCOME" in want:
        assert "recovered" in stages["OUTCOME"], stages
    assert "interrupted: stopping every process" in out and "missing 0; duplicates 0" in out
    assert len(running) >= 10, running  # broker, workers, sink, Slurm, Prometheus, ...
    _nothing_left_and_no_errors(root)
    if not _outcome_supported():
        pytest.skip(
            "the loop closed; the remediator in this build records no outcome "
            "(recovered/not_recovered) yet, so that stage was not checked"
        )


@pytest.mark.timeout(300)
def test_torch_demo_closes_the_loop(tmp_path) -> None:
    """``stepwatch demo --torch``: the real DDP job on the Slurm job's nodes, restarted from its
    checkpoint on the new allocation after the drain and requeue (about 110 s on 2 cores)."""
    pytest.importorskip("torch")
    _needs_the_loop()
    root = _copy_repo(tmp_path / "repo")
    want = [*STAGES, "OUTCOME"] if _outcome_supported() else list(STAGES)
    out, running, loop_s = _run_to_the_end(
        [".venv/bin/stepwatch", "demo", "--torch", "--plain", "--duration", "240"], root, want, 200
    )
    stages = _stage_lines(out)
    assert all(s in stages for s in want), f"after {loop_s:.0f} s: {stages}\n{out[-4000:]}"
    print(
        f"\ndemo --torch: the loop closed in {loop_s:.0f} s; "
        + "; ".join(f"{k.lower()} {v}" for k, v in stages.items())
    )
    # The demo's slow "GPU" is extra forward compute on a CPU, on 2 cores shared with the
    # whole stack: when the other processes keep that compute waiting for a CPU for most of
    # its excess, the detector names what it measured, CPU contention. Any other cause
    # (a slow data phase, the network, unknown) is wrong.
    found = re.search(r"rank 3 host=node02 cause=(\S+)(?: \(([^)]*)\))?", stages["FOUND"])
    assert found is not None, stages
    cause, why = found.groups()
    assert cause == "gpu" or (cause, why) == ("host_input", "cpu_contention"), stages
    assert "drain node02" in stages["DRAINED"] and "requeue job" in stages["REQUEUED"], stages
    again = re.search(r"from step (\d+) on (\S+)", stages["RUNNING AGAIN"])
    assert again is not None and "node02" not in again.group(2), stages
    step = int(again.group(1))
    assert step > 0 and step % 100 == 0, stages  # the checkpoint's step (one every 100)
    assert "straggler resolved" in stages["RECOVERED"], stages
    if "OUTCOME" in want:
        assert "recovered" in stages["OUTCOME"], stages
    summary = out[out.rfind("published ") :]
    assert "interrupted: stopping every process" in out, out[-3000:]
    assert "duplicates 0" in summary, summary[:1500]
    assert len(running) >= 10, running  # broker, workers, sink, Slurm, agents, the ranks, ...
    workdir = _nothing_left_and_no_errors(root)
    # nothing lost, judged on what the store holds: every agent's sequence numbers complete
    # (the demo's own tap has reported 2 of ~275 messages missing in some runs while the
    # store held every one: a known bug of the tap's view, not a loss)
    streams = _sql(
        root,
        "SELECT concat(k, ':', host, ':', inst) AS s, u, hi FROM ("
        "SELECT 'steps' AS k, host, inst, uniqExact(seq) AS u, max(seq) AS hi "
        "FROM step_events GROUP BY host, inst UNION ALL "
        "SELECT 'events' AS k, host, inst, uniqExact(seq) AS u, max(seq) AS hi "
        "FROM events GROUP BY host, inst)",
    )
    assert len(streams) >= 4 and all(u == hi + 1 for u, hi in streams.values()), (
        streams,
        summary[:1500],
    )
    assert f"resumed from {workdir}/checkpoints/checkpoint.pt at step {step}" in (
        workdir / "ddp_train.log"
    ).read_text(errors="replace")
    # the slow rank's steps as stored: on node02 up to the kill, then from the checkpoint's
    # step on its new node (a rewind when the kill came after it)
    new_node = again.group(2).split(",")[1]
    rows = _sql(
        root,
        "SELECT host, min(step), max(step) FROM step_events WHERE rank = 3 "
        f"AND host IN ('node02', '{new_node}') GROUP BY host ORDER BY host",
    )
    assert rows[new_node][0] == step and rows["node02"][1] >= step - 1, rows
    worker = (workdir / "stream-0.log").read_text(errors="replace")
    rewinds = re.findall(r"job rewound job_id=\d+ from_step=\d+ to_step=(\d+)", worker)
    assert set(rewinds) <= {str(step)}, rewinds


def _sql(root: Path, query: str) -> dict[str, tuple[int, ...]]:
    """Rows of ``query`` on the demo's store, by their first column (integers after it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPWATCH_")}
    env["PYTHONPATH"] = str(root)
    done = subprocess.run(
        [".venv/bin/stepwatch", "sql", "--store-path", "var/demo/chdb", query],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    rows = [line.split() for line in done.stdout.splitlines()[2:] if line.strip()]
    return {r[0]: tuple(int(v) for v in r[1:]) for r in rows if len(r) > 1 and r[1].isdigit()}


@pytest.mark.timeout(240)
def test_demo_runs_finds_the_straggler_and_loses_nothing(tmp_path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "stepwatch.cli",
        "demo",
        "--plain",
        "--duration",
        "40",
        "--nodes",
        "2",
        "--step-seconds",
        "0.5",
        "--workers",
        "1",
        "--fault",
        "slow_gpu:rank=5:start=8:severity=0.3",
        "--workdir",
        str(tmp_path / "demo"),
        "--no-alerting",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=200)
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-3000:]
    summary = out[out.rindex("published ") :]
    published = int(summary.split()[1])
    arrived = int(summary.split("arrived ")[1].split(";")[0])
    assert published > 50 and arrived == published
    assert "missing 0; duplicates 0; undelivered 0" in summary
    assert "status: steps=" in out  # plain mode: a short status line, changes only
    # the stream worker found the injected straggler and said why
    assert "straggler job=demo-job rank=5 host=node0000 cause=gpu" in summary
    assert "stepwatch query job_timeline" in summary
