"""Who sent a step datagram: fake /proc trees, the identity cache, the gate's checks,
rate limits."""

from __future__ import annotations

from pathlib import Path

import pytest

from stepwatch.agents.collectors.creds import Creds
from stepwatch.agents.collectors.procfs import IdentityCache, ProcFS, _parse_environ
from stepwatch.agents.collectors.ratelimit import TokenBuckets
from stepwatch.agents.collectors.senders import (
    LOCAL,
    Sender,
    SenderGate,
    SenderPolicy,
    VerifyJob,
)
from stepwatch.errors import ConfigError

SLURM_V1 = "12:pids:/slurm/uid_1000/job_42/step_0/task_3\n1:name=systemd:/user.slice\n"
SLURM_V2 = "0::/system.slice/slurmstepd.scope/job_42/step_0/user/task_0\n"
K8S_CGROUPFS = "0::/kubepods/burstable/pod0d2b9c1e-1111-2222-3333-444455556666/abc123\n"
K8S_SYSTEMD = (
    "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-"
    "pod0d2b9c1e_1111_2222_3333_444455556666.slice/cri-containerd-abc.scope\n"
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def fake_proc(
    root: Path,
    pid: int,
    *,
    start: int = 5000,
    cgroup: str = "0::/\n",
    env: dict[str, str] | None = None,
    comm: str = "python",
) -> None:
    d = root / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    # fields after the command: state, ppid, ... field 22 is the start time
    rest = ["S"] + ["0"] * 18 + [str(start)] + ["0"] * 10
    (d / "stat").write_text(f"{pid} ({comm}) " + " ".join(rest) + "\n")
    (d / "cgroup").write_text(cgroup)
    (d / "environ").write_bytes(b"\0".join(f"{k}={v}".encode() for k, v in (env or {}).items()))


def gate(root: Path, clock: Clock | None = None, **policy: object) -> SenderGate:
    return SenderGate(
        SenderPolicy(proc_root=str(root), **policy),  # type: ignore[arg-type]
        clock=clock or Clock(),
        hostname=lambda: "gpu-017.cluster.example",
    )


def sender(g: SenderGate, pid: int, uid: int = 1000) -> Sender:
    s = g.admit(Creds(pid, uid, uid))
    assert s is not None
    return s


# ---------------------------------------------------------------------- /proc parsing
@pytest.mark.parametrize("cgroup", [SLURM_V1, SLURM_V2])
def test_slurm_job_from_cgroup_v1_and_v2(tmp_path: Path, cgroup: str) -> None:
    fake_proc(tmp_path, 7, cgroup=cgroup, comm="python train.py) x (")
    ident = ProcFS(tmp_path).identity(7)
    assert ident is not None and ident.slurm_job == "42" and ident.start_time == 5000


@pytest.mark.parametrize("cgroup", [K8S_CGROUPFS, K8S_SYSTEMD])
def test_pod_uid_from_cgroupfs_and_systemd_drivers(tmp_path: Path, cgroup: str) -> None:
    fake_proc(tmp_path, 7, cgroup=cgroup)
    ident = ProcFS(tmp_path).identity(7)
    assert ident is not None and ident.pod_uid == "0d2b9c1e-1111-2222-3333-444455556666"


DELEGATED = "/user.slice/user-1000.slice/user@1000.service/app.slice"  # the user's own


@pytest.mark.parametrize(
    "cgroup",
    [
        f"0::{DELEGATED}/x/job_42/step_0\n",
        f"0::{DELEGATED}/system.slice/slurmstepd.scope/job_42/step_0\n",
        f"8:pids:{DELEGATED}/slurm/uid_1000/job_42/step_0\n",
        f"0::{DELEGATED}/pod0d2b9c1e-1111-2222-3333-444455556666/x\n",
        f"0::{DELEGATED}/kubepods/burstable/pod0d2b9c1e-1111-2222-3333-444455556666/x\n",
    ],
)
def test_a_job_or_pod_folder_outside_the_schedulers_root_is_no_evidence(
    tmp_path: Path, cgroup: str
) -> None:
    """A user's delegated cgroup subtree (any login session on a systemd node) can hold a
    folder it named ``job_42`` or ``pod<uid>``; a process moved itself in and the agent
    took job 42 (strong evidence) over its own SLURM_JOB_ID=41."""
    fake_proc(tmp_path, 7, cgroup=cgroup, env={"SLURM_JOB_ID": "41"})
    ident = ProcFS(tmp_path).identity(7)
    assert ident is not None and (ident.slurm_job, ident.pod_uid) == ("", "")
    g = gate(tmp_path)
    assert g.check(sender(g, 7), "h", "", "42", 0) == "job_mismatch"


def test_the_job_is_read_from_any_line_and_a_users_subfolder_changes_nothing(
    tmp_path: Path,
) -> None:
    cgroup = "12:pids:/slurm/uid_1000/job_42\n0::/system.slice/slurmstepd.scope/job_42/x\n"
    fake_proc(tmp_path, 7, cgroup=cgroup)
    assert ProcFS(tmp_path).identity(7).slurm_job == "42"  # type: ignore[union-attr]
    inner = "0::/system.slice/slurmstepd.scope/job_41/step_0/user/job_42/step_0\n"
    fake_proc(tmp_path, 8, cgroup=inner)
    assert ProcFS(tmp_path).identity(8).slurm_job == "41"  # type: ignore[union-attr]


def test_environment_jobs_and_rank(tmp_path: Path) -> None:
    fake_proc(
        tmp_path,
        7,
        env={
            "SLURM_JOB_ID": "41",
            "TORCHELASTIC_RUN_ID": "none",
            "RANK": "3",
            "POD_NAME": "llm-worker-2",
            "POD_NAMESPACE": "ml",
        },
    )
    ident = ProcFS(tmp_path).identity(7)
    assert ident is not None
    assert ident.env_jobs == {"41", "ml/llm"} and ident.env_rank == 3 and ident.known


def test_torchrun_without_rdzv_id_is_the_job_its_store_names(tmp_path: Path) -> None:
    """The SDK names such a job by its store's address (sdk/identity.py): the agent reads
    the same id from the sender's environment, so it verifies it (strict mode refused
    it as unverified) and ties the rank's exit to it."""
    env = {"TORCHELASTIC_RUN_ID": "none", "MASTER_ADDR": "node07", "MASTER_PORT": "38009"}
    fake_proc(tmp_path, 7, env={**env, "RANK": "1"})
    ident = ProcFS(tmp_path).identity(7)
    assert ident is not None and ident.env_jobs == {"torchrun-node07-38009"}
    from stepwatch.sdk.identity import detect_identity

    assert detect_identity(env).job_id == "torchrun-node07-38009"


def test_a_huge_environment_yields_only_the_identitys_variables(tmp_path: Path) -> None:
    """Before, every variable went into a dict (10,000 of them: ~4 ms a lookup, and a user
    cycling pids through the cache starved the socket's reader). Look-alike names (a
    prefix, a suffix, a value holding one) are not the variables."""
    env = {f"FILLER_{i}": "x" * 8 for i in range(10_000)}  # within the bytes read
    env.update({"XRANK": "9", "RANKX": "8", "NOTE": "RANK=7", "RANK": "2", "SLURM_JOB_ID": "41"})
    fake_proc(tmp_path, 7, env=env)
    raw = (tmp_path / "7" / "environ").read_bytes()
    assert _parse_environ(raw) == {"RANK": "2", "SLURM_JOB_ID": "41"}
    ident = ProcFS(tmp_path).identity(7)
    assert ident is not None and ident.env_rank == 2 and ident.env_jobs == {"41"}
    assert _parse_environ(b"RANK=1\0RANK=4") == {"RANK": "4"}  # the last, as the process sees


def test_a_gone_process_has_no_identity(tmp_path: Path) -> None:
    assert ProcFS(tmp_path).identity(12345) is None
    assert ProcFS(tmp_path).start_time(12345) is None


def test_cache_is_keyed_on_pid_and_start_time(tmp_path: Path) -> None:
    clock = Clock()
    fake_proc(tmp_path, 7, start=5000, env={"SLURM_JOB_ID": "41"})
    cache = IdentityCache(ProcFS(tmp_path), ttl=30, clock=clock)
    assert cache.get(7).env_jobs == {"41"}  # type: ignore[union-attr]
    assert cache.get(7).env_jobs == {"41"} and cache.lookups == 1  # type: ignore[union-attr]
    fake_proc(tmp_path, 7, start=9000, env={"SLURM_JOB_ID": "99"})  # pid reused
    assert cache.get(7).env_jobs == {"99"} and cache.lookups == 2  # type: ignore[union-attr]


def test_cache_keeps_an_exited_process_briefly_then_forgets_it(tmp_path: Path) -> None:
    clock = Clock()
    fake_proc(tmp_path, 7, env={"SLURM_JOB_ID": "41"})
    cache = IdentityCache(ProcFS(tmp_path), ttl=30, clock=clock)
    cache.get(7)
    for name in ("stat", "cgroup", "environ"):
        (tmp_path / "7" / name).unlink()
    assert cache.get(7).env_jobs == {"41"}  # type: ignore[union-attr]  # its last datagrams
    clock.now += 31
    assert cache.get(7) is None


def test_cache_is_bounded(tmp_path: Path) -> None:
    cache = IdentityCache(ProcFS(tmp_path), max_entries=3)
    for pid in range(10, 20):
        fake_proc(tmp_path, pid)
        cache.get(pid)
    assert len(cache._entries) == 3


# ---------------------------------------------------------------------- the gate
def test_host_claims_other_than_this_host_are_rejected(tmp_path: Path) -> None:
    g = gate(tmp_path, host_aliases=frozenset({"node17"}))
    s = LOCAL
    assert g.check(s, "gpu-017", "", "j", 0) is None  # empty: the agent stamps it
    assert g.check(s, "gpu-017", "gpu-017", "j", 0) is None
    assert g.check(s, "gpu-017", "node17", "j", 0) is None  # a configured alias
    assert g.check(s, "gpu-017", "gpu-017.cluster.example", "j", 0) is None  # the machine's name
    assert g.check(s, "gpu-017", "gpu-[001-100]", "j", 0) == "host_mismatch"
    assert g.check(s, "gpu-017", "gpu-018", "j", 0) == "host_mismatch"


def test_cgroup_job_is_strong_evidence(tmp_path: Path) -> None:
    fake_proc(tmp_path, 7, cgroup=SLURM_V2, env={"STEPWATCH_JOB_ID": "43", "SLURM_JOB_ID": "43"})
    g = gate(tmp_path)
    s = sender(g, 7)
    assert g.check(s, "h", "", "42", 0) is None
    assert g.check(s, "h", "", "43", 0) == "job_mismatch"  # the environment cannot override it


def test_environment_job_and_rank(tmp_path: Path) -> None:
    fake_proc(tmp_path, 7, env={"SLURM_JOB_ID": "41", "RANK": "3"})
    g = gate(tmp_path)
    s = sender(g, 7)
    assert g.check(s, "h", "", "41", 3) is None
    assert g.check(s, "h", "", "42", 3) == "job_mismatch"
    assert g.check(s, "h", "", "41", 4) == "rank_mismatch"
    assert g.check(s, "h", "", "41", None) is None  # events without a rank


def test_pod_environment_that_contradicts_the_cgroup(tmp_path: Path) -> None:
    fake_proc(
        tmp_path,
        7,
        cgroup=K8S_CGROUPFS,
        env={"POD_UID": "ffffffff-1111-2222-3333-444455556666", "STEPWATCH_JOB_ID": "j"},
    )
    g = gate(tmp_path)
    assert g.check(sender(g, 7), "h", "", "j", 0) == "job_mismatch"


@pytest.mark.parametrize(
    ("policy", "expected"),
    [(VerifyJob.OFF, None), (VerifyJob.WHEN_KNOWN, None), (VerifyJob.STRICT, "job_unverified")],
)
def test_unverifiable_sender_follows_the_policy(
    tmp_path: Path, policy: VerifyJob, expected: str | None
) -> None:
    fake_proc(tmp_path, 7, env={"HOME": "/root"})  # no job anywhere
    g = gate(tmp_path, verify_job=policy)
    assert g.check(sender(g, 7), "h", "", "anything", 0) == expected
    assert g.check(sender(g, 8), "h", "", "anything", 0) == expected  # pid 8: gone


def test_verify_off_checks_no_job_but_still_the_host(tmp_path: Path) -> None:
    fake_proc(tmp_path, 7, env={"SLURM_JOB_ID": "41"})
    g = gate(tmp_path, verify_job=VerifyJob.OFF)
    s = sender(g, 7)
    assert s.identity is None  # /proc is not even read
    assert g.check(s, "h", "", "42", 0) is None
    assert g.check(s, "h", "elsewhere", "41", 0) == "host_mismatch"


def test_verify_job_setting_is_parsed() -> None:
    assert VerifyJob.parse(" When-Known ") is VerifyJob.WHEN_KNOWN
    with pytest.raises(ConfigError):
        VerifyJob.parse("maybe")


# ---------------------------------------------------------------------- rate limits
def test_token_bucket_burst_then_rate() -> None:
    clock = Clock()
    buckets = TokenBuckets(rate=10, burst=5, clock=clock)
    assert [buckets.allow("p") for _ in range(7)] == [True] * 5 + [False] * 2
    clock.now += 0.5  # five tokens back (a full bucket)
    assert [buckets.allow("p") for _ in range(6)] == [True] * 5 + [False]
    assert buckets.allow("other")  # each key has its own bucket


def test_token_bucket_table_is_bounded_and_zero_rate_is_off() -> None:
    buckets = TokenBuckets(rate=1, burst=1, max_keys=100)
    for key in range(10_000):
        buckets.allow(key)
    assert len(buckets) == 100
    off = TokenBuckets(rate=0, burst=1)
    assert all(off.allow("p") for _ in range(10_000)) and len(off) == 0


def test_gate_limits_each_process_and_each_user(tmp_path: Path) -> None:
    g = gate(tmp_path, sender_rate=1, sender_burst=10, user_rate=1, user_burst=15)
    first = [g.admit(Creds(7, 1000, 1000)) for _ in range(20)]
    assert sum(s is not None for s in first) == 10  # the process's burst
    second = [g.admit(Creds(8, 1000, 1000)) for _ in range(20)]
    assert sum(s is not None for s in second) == 5  # what is left of the user's burst
    other_user = [g.admit(Creds(9, 1001, 1001)) for _ in range(20)]
    assert sum(s is not None for s in other_user) == 10  # another user is not starved
    assert g.rate_limited == 10 + 15 + 10


def test_big_datagrams_cost_more_of_the_rate_limit(tmp_path: Path) -> None:
    """Before, the limits counted datagrams: 4,000 a second of 16 KiB each (one user's
    allowance) cost the agent ~1.1 s of CPU a second and 61 MiB of spool."""
    g = gate(tmp_path, sender_rate=1, sender_burst=80, user_rate=1, user_burst=800)
    small = [g.admit(Creds(7, 1000, 1000), 600) for _ in range(100)]
    assert sum(s is not None for s in small) == 80  # an SDK step: one token each
    big = [g.admit(Creds(8, 1000, 1000), 16 * 1024) for _ in range(100)]
    assert sum(s is not None for s in big) == 10  # 8 tokens each


def test_sender_outside_the_pid_namespace_is_limited_per_user_and_unverified(
    tmp_path: Path,
) -> None:
    g = gate(tmp_path, verify_job=VerifyJob.STRICT, sender_burst=2, user_burst=5)
    admitted = [g.admit(Creds(0, 1000, 1000)) for _ in range(8)]
    assert sum(s is not None for s in admitted) == 5  # no shared pid-0 bucket, the user's
    assert g.check(admitted[0], "h", "", "j", 0) == "job_unverified"  # type: ignore[arg-type]


def test_real_proc_pins_a_live_sender_and_notices_when_it_exits() -> None:
    import subprocess
    import sys

    child = subprocess.Popen(
        [sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(30)"],
        env={"SLURM_JOB_ID": "41", "PATH": "/usr/bin:/bin"},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None and child.stdout.readline() == "ready\n"  # fully started
    cache = IdentityCache(ProcFS("/proc"))
    try:
        assert cache.get(child.pid).env_jobs == {"41"}  # type: ignore[union-attr]
        assert cache._entries[child.pid][2] >= 0  # a pidfd holds it: no /proc read per datagram
        assert cache.get(child.pid) is not None and cache.lookups == 1
    finally:
        child.kill()
        child.wait()
    assert cache.get(child.pid).env_jobs == {"41"}  # type: ignore[union-attr]  # its last ones
    cache.close()
    assert not cache._entries
