"""A real multi-node Slurm cluster on one host, for tests and the demo.

One ``slurmctld`` and one ``slurmd -N nodeNN`` per node, all on this host
(``NodeHostname`` = this host's name, a distinct port per node), with
``proctrack/linuxproc`` and ``task/none`` so no cgroups are needed; the config
lives in a temporary directory, with a private ``munged`` on its own socket
(clusters side by side never share one; it needs the key in ``/etc/munge``).
Commands see the cluster through :meth:`SlurmCluster.env` (``SLURM_CONF``).
Needs root (slurmd runs jobs as their user). Daemons run in their own sessions
(a terminal's Ctrl-C reaches the caller, which cancels the jobs first). Stops
cleanly: jobs cancelled, every daemon SIGTERM then SIGKILL, and any process
still carrying this cluster's ``SLURM_CONF`` (an orphaned ``slurmstepd`` and
its job) stopped too.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from stepwatch.daemons.process import free_port, sweep
from stepwatch.errors import DaemonError

log = logging.getLogger(__name__)

BINARIES = ("slurmctld", "slurmd", "scontrol", "sinfo", "sbatch", "squeue", "scancel", "munged")


def missing_binaries() -> list[str]:
    """Which of the binaries the cluster needs are not installed."""
    return [b for b in BINARIES if not (shutil.which(b) or shutil.which(b, path="/usr/sbin:/sbin"))]


def _bin(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")
    if not found:
        raise DaemonError(f"{name} not found: install Debian's slurm-wlm and munge")
    return found


@dataclass
class SlurmCluster:
    workdir: Path
    nodes: int = 4
    cpus: int = 1
    ctld_port: int = 0
    cred_expire: int = 120  # seconds; Slurm's default (a requeued job waits this long)
    _procs: list[subprocess.Popen[bytes]] = field(default_factory=list, repr=False)
    _munged: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _run_dir: Path | None = field(default=None, repr=False)

    @property
    def node_names(self) -> list[str]:
        return [f"node{i:02d}" for i in range(1, self.nodes + 1)]

    @property
    def conf_path(self) -> Path:
        return self.workdir / "slurm.conf"

    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf_path)}

    def start(self, timeout: float = 60.0) -> SlurmCluster:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._ensure_munge()
        self._write_config()
        self._spawn("slurmctld", [_bin("slurmctld"), "-D", "-c", "-f", str(self.conf_path)])
        self._wait(lambda: self.scontrol("ping", check=False).find("UP") >= 0, timeout, "slurmctld")
        for name in self.node_names:
            self._spawn(
                f"slurmd-{name}", [_bin("slurmd"), "-D", "-N", name, "-f", str(self.conf_path)]
            )
        self._wait(self._all_idle, timeout, "every slurmd idle")
        log.info("slurm ready nodes=%s conf=%s", ",".join(self.node_names), self.conf_path)
        return self

    def _ensure_munge(self) -> None:
        """A private munged on its own socket: clusters started side by side never share one."""
        # sockets live in a short private folder: a Unix socket path is < 108 bytes
        self._run_dir = Path(tempfile.mkdtemp(prefix="swslurm-"))
        self._run_dir.chmod(0o755)
        sock = self.munge_socket
        self._munged = subprocess.Popen(
            [
                _bin("munged"),
                "--foreground",
                "--force",
                f"--socket={sock}",
                f"--pid-file={self._run_dir / 'munged.pid'}",
                f"--seed-file={self._run_dir / 'seed'}",
                f"--log-file={self.workdir / 'munged.log'}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self._wait(sock.exists, 15, "munged")

    @property
    def spool_dir(self) -> Path:
        if self._run_dir is None:
            raise DaemonError("the cluster is not started")
        return self._run_dir / "spool"

    @property
    def munge_socket(self) -> Path:
        if self._run_dir is None:
            raise DaemonError("munged is not started")
        return self._run_dir / "sock"

    def _write_config(self) -> None:
        host = socket.gethostname()
        self.ctld_port = self.ctld_port or free_port()
        d = self.workdir
        (d / "state").mkdir(exist_ok=True)
        for name in self.node_names:  # slurmd's and slurmstepd's sockets: the short folder
            (self.spool_dir / name).mkdir(parents=True, exist_ok=True)
        lines = [
            "ClusterName=stepwatch",
            f"SlurmctldHost={host}",
            f"SlurmctldPort={self.ctld_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            # cred_expire is also how long a requeued job waits before it may start again
            f"AuthInfo=socket={self.munge_socket},cred_expire={self.cred_expire}",
            f"StateSaveLocation={d}/state",
            f"SlurmdSpoolDir={self.spool_dir}/%n",
            f"SlurmctldPidFile={d}/slurmctld.pid",
            f"SlurmdPidFile={d}/slurmd.%n.pid",
            f"SlurmctldLogFile={d}/slurmctld.log",
            f"SlurmdLogFile={d}/slurmd.%n.log",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "MpiDefault=none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "SchedulerType=sched/backfill",
            "ReturnToService=2",
            "JobRequeue=1",
            "SlurmdParameters=config_overrides",
            "SchedulerParameters=sched_interval=1",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "JobAcctGatherType=jobacct_gather/none",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=30",
            "MessageTimeout=10",
            "InactiveLimit=0",
            "MinJobAge=300",
            "MailProg=/bin/true",
        ]
        plugins = self._plugin_dir()
        if plugins is not None:
            lines.append(f"PluginDir={plugins}")
        for name in self.node_names:
            lines.append(
                f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 "
                f"Port={free_port()} CPUs={self.cpus} State=UNKNOWN"
            )
        lines.append("PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        self.conf_path.write_text("\n".join(lines) + "\n")

    def _plugin_dir(self) -> Path | None:
        """Slurm's plugins less PMIx: slurmd loads every MPI plugin at start, and PMIx's
        fails (and logs errors) where libpmix is not installed. None: the default."""
        found = sorted(Path("/usr/lib").glob("*/slurm-wlm/mpi_none.so")) or sorted(
            Path("/usr/lib").glob("slurm*/mpi_none.so")
        )
        if not found:
            return None
        src, dst = found[0].parent, self.workdir / "plugins"
        dst.mkdir(exist_ok=True)
        for plugin in src.glob("*.so"):
            if not plugin.name.startswith("mpi_pmix") and not (dst / plugin.name).exists():
                (dst / plugin.name).symlink_to(plugin)
        return dst

    def _spawn(self, name: str, argv: list[str]) -> None:
        out = open(self.workdir / f"{name}.out", "ab")  # noqa: SIM115 - closed by the child's exit
        # own session: a terminal's Ctrl-C must not kill slurmctld before the jobs are cancelled
        self._procs.append(
            subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=self.env(), start_new_session=True
            )
        )
        out.close()

    def _wait(self, probe: object, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if callable(probe) and probe():
                return
            dead = [p for p in self._procs if p.poll() is not None]
            if dead:
                self.stop()
                raise DaemonError(f"slurm daemon exited at start ({what}): {self.log_tail()}")
            time.sleep(0.2)
        self.stop()
        raise DaemonError(f"slurm not ready after {timeout:.0f} s ({what}): {self.log_tail()}")

    def _all_idle(self) -> bool:
        states = self.node_states()
        return len(states) == self.nodes and all(s.startswith("idle") for s in states.values())

    def scontrol(self, *args: str, check: bool = True) -> str:
        return self._run([_bin("scontrol"), *args], check)

    def _run(self, argv: list[str], check: bool = True) -> str:
        # own session, as the daemons: a terminal's Ctrl-C must not cut a request mid-reply
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            env=self.env(),
            timeout=30,
            check=False,
            start_new_session=True,
        )
        if check and done.returncode != 0:
            raise DaemonError(f"{' '.join(argv[:3])} failed: {done.stderr.strip()}")
        return done.stdout

    def node_states(self) -> dict[str, str]:
        out = self._run([_bin("sinfo"), "-h", "-N", "-o", "%N %t"], check=False)
        return dict(line.split() for line in out.splitlines() if len(line.split()) == 2)

    def sbatch(self, *args: str) -> str:
        """Submit a batch job; returns its id."""
        out = self._run([_bin("sbatch"), "--parsable", *args])
        return out.strip().split(";")[0]

    def log_tail(self, chars: int = 1500) -> str:
        try:
            return (self.workdir / "slurmctld.log").read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def cancel_jobs(self, timeout: float = 10.0) -> None:
        """Cancel every job and wait until their processes are gone (slurmstepd outlives slurmd)."""
        jobs = self._run([_bin("squeue"), "-h", "-o", "%i"], check=False).split()
        if not jobs:
            return
        self._run([_bin("scancel"), *jobs], check=False)
        deadline = time.monotonic() + timeout
        while (
            time.monotonic() < deadline
            and self._run([_bin("squeue"), "-h", "-t", "R,CG", "-o", "%i"], check=False).strip()
        ):
            time.sleep(0.2)

    def stop(self) -> None:
        if self._procs and self._procs[0].poll() is None:
            self.cancel_jobs()
        procs, self._procs = self._procs[::-1], []
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        left = sweep(f"SLURM_CONF={self.conf_path}")
        if left:
            log.info("slurm: stopped what outlived its daemons pids=%s", left)
        if self._munged is not None and self._munged.poll() is None:
            self._munged.terminate()
            self._munged.wait(timeout=10)
        self._munged = None
        if self._run_dir is not None:
            shutil.rmtree(self._run_dir, ignore_errors=True)
            self._run_dir = None
        log.info("slurm stopped conf=%s", self.conf_path)

    def __enter__(self) -> SlurmCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
