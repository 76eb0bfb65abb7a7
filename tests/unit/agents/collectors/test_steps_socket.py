"""The step socket as a trust boundary, on a real socket: modes, group, credentials, limits."""

from __future__ import annotations

import grp
import os
import socket
import stat
import time
from pathlib import Path

import msgspec
import pytest

from stepwatch.agents.collectors.base import HostContext
from stepwatch.agents.collectors.senders import SenderGate, SenderPolicy
from stepwatch.agents.collectors.steps import StepsCollector
from stepwatch.contract import StepMessage, StepRecord, encode
from stepwatch.contract.wire import RankStep, encode_datagram
from stepwatch.errors import ConfigError
from stepwatch.sdk.configure import _socket_path
from stepwatch.settings import DEFAULT_AGENT_SOCKET, Settings

NOW = time.time()


def step(job: str, rank: int = 0, n: int = 0, host: str = "") -> bytes:
    rec = StepRecord(
        job_id=job, rank=rank, world_size=16, step=n, start=NOW - 1, end=NOW, host=host
    )
    return encode_datagram(RankStep(step=rec))


def send(path: str, *datagrams: bytes) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        for d in datagrams:
            s.sendto(d, path)


def collect(c: StepsCollector, expect: int, host: str = "node07") -> list:
    deadline = time.monotonic() + 5
    while len(c._buf) + c.gate.rate_limited < expect and time.monotonic() < deadline:
        time.sleep(0.005)
    return c.collect(HostContext(host, NOW, {}))


def own_proc(root: Path, env: dict[str, str]) -> Path:
    """A fake /proc entry for this very process: the kernel's pid, made-up environment."""
    me = root / str(os.getpid())
    me.mkdir(parents=True)
    real = Path(f"/proc/{os.getpid()}/stat").read_text()
    (me / "stat").write_text(real)  # the real start time: the cache keys on it
    (me / "cgroup").write_text("0::/\n")
    (me / "environ").write_bytes(b"\0".join(f"{k}={v}".encode() for k, v in env.items()))
    return root


def test_default_socket_is_in_a_directory_of_its_own_for_agent_and_sdk() -> None:
    assert Path(DEFAULT_AGENT_SOCKET).parent != Path("/tmp")
    assert Settings.load(env={}).agent_socket == DEFAULT_AGENT_SOCKET
    assert _socket_path(None, None, {}) == DEFAULT_AGENT_SOCKET


def test_directory_0750_and_socket_0620_of_the_configured_group(tmp_path: Path) -> None:
    path = tmp_path / "run" / "agent.sock"
    group = grp.getgrgid(os.getegid()).gr_name
    c = StepsCollector(str(path), group=group)
    try:
        d, s = path.parent.stat(), path.stat()
        assert stat.S_IMODE(d.st_mode) == 0o750 and stat.S_IMODE(s.st_mode) == 0o620
        assert d.st_gid == s.st_gid == os.getegid()
        assert not s.st_mode & (stat.S_IWOTH | stat.S_IROTH)
    finally:
        c.close()


def test_unknown_group_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no group named"):
        StepsCollector(str(tmp_path / "run" / "a.sock"), group="no-such-group-here")


def test_world_writable_directory_is_refused(tmp_path: Path) -> None:
    d = tmp_path / "open"
    d.mkdir()
    os.chmod(d, 0o777)
    c = StepsCollector(str(d / "agent.sock"))
    try:
        assert c._sock is None and "world-writable" in c.health().last_error
    finally:
        c.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_directory_of_another_user_is_refused(tmp_path: Path) -> None:
    d = tmp_path / "theirs"
    d.mkdir(mode=0o755)
    os.chown(d, 65534, 65534)
    c = StepsCollector(str(d / "agent.sock"))
    try:
        assert c._sock is None and "belongs to uid 65534" in c.health().last_error
    finally:
        c.close()


def test_kernel_credentials_reach_the_gate_and_a_forged_job_is_rejected(tmp_path: Path) -> None:
    proc = own_proc(tmp_path / "proc", {"SLURM_JOB_ID": "41", "RANK": "0"})
    gate = SenderGate(SenderPolicy(proc_root=str(proc)))
    path = str(tmp_path / "run" / "agent.sock")
    c = StepsCollector(path, gate=gate)
    try:
        send(path, step("41"), step("42"), step("41", rank=5), step("41", host="gpu-[001-100]"))
        out = collect(c, expect=4)
    finally:
        c.close()
    steps = [r for m in out if isinstance(m, StepMessage) for r in m.steps]
    assert [(r.job_id, r.rank, r.host) for r in steps] == [("41", 0, "node07")]
    assert dict(c.rejected) == {"job_mismatch": 1, "rank_mismatch": 1, "host_mismatch": 1}


def test_one_process_flood_is_rate_limited_and_counted(tmp_path: Path) -> None:
    gate = SenderGate(SenderPolicy(sender_rate=0.001, sender_burst=50))
    path = str(tmp_path / "run" / "agent.sock")
    c = StepsCollector(path, gate=gate)
    try:
        send(path, *[step("j", n=i) for i in range(200)])
        out = collect(c, expect=200)
    finally:
        c.close()
    assert sum(len(m.steps) for m in out if isinstance(m, StepMessage)) == 50
    assert c.rejected["rate_limited"] == 150


def test_a_big_tick_is_split_into_messages_under_the_limit(tmp_path: Path) -> None:
    c = StepsCollector(str(tmp_path / "run" / "a.sock"), max_message_bytes=16 * 1024)
    try:
        for i in range(3000):
            c.feed(step("j", rank=i % 8, n=i))
        out = c.collect(HostContext("node07", NOW, {}))
    finally:
        c.close()
    stamped = [msgspec.structs.replace(m, inst="abcd1234", seq=10**9) for m in out]
    sizes = [len(encode(m)) for m in stamped]
    assert len(out) > 10 and max(sizes) <= 16 * 1024
    assert sorted(r.step for m in out for r in m.steps) == list(range(3000))


def test_sdk_counts_a_socket_it_may_not_write_to(tmp_path: Path) -> None:
    """The SDK never fails for it: the datagram is dropped and counted as no_permission."""
    from stepwatch.sdk.transport import DatagramSender

    path = tmp_path / "run" / "a.sock"
    c = StepsCollector(str(path))
    try:
        if os.geteuid() != 0:
            os.chmod(path, 0o400)
            sender = DatagramSender(str(path))
            assert not sender.send_bytes(step("j")) and sender.dropped == {"no_permission": 1}
            return
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: another user (nobody), same socket
            try:
                os.setgroups([])
                os.setgid(65534)
                os.setuid(65534)
                sender = DatagramSender(str(path))
                ok = not sender.send_bytes(step("j")) and sender.dropped == {"no_permission": 1}
                os.write(write, b"1" if ok else b"0")
            finally:
                os._exit(0)
        os.close(write)
        assert os.read(read, 1) == b"1"
        os.waitpid(pid, 0)
    finally:
        c.close()
