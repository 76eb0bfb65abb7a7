"""The real Alertmanager on a loopback port.

Starts Debian's ``prometheus-alertmanager`` with a given config (YAML text or a
file) in a private directory, clustering off (``--cluster.listen-address=``),
and waits for ``/-/ready``. Helpers wrap the v2 API: list alerts, post alerts
(what Prometheus does), reload the config.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stepwatch.daemons.process import (
    LOOPBACK,
    Daemon,
    ManagedProcess,
    find_binary,
    free_port,
    get_json,
    http_post,
)

log = logging.getLogger(__name__)


@dataclass
class Alertmanager(Daemon):
    """An Alertmanager process. ``config`` is YAML text or a path to a file."""

    workdir: Path
    config: str | Path
    port: int = 0
    host: str = LOOPBACK
    _proc: ManagedProcess | None = field(default=None, repr=False)

    @property
    def address(self) -> str:
        """host:port, the form Prometheus' ``alerting`` section takes."""
        return f"{self.host}:{self.port}"

    @property
    def config_path(self) -> Path:
        return (
            Path(self.config)
            if isinstance(self.config, Path)
            else self.workdir / "alertmanager.yml"
        )

    def start(self, timeout: float = 30.0) -> Alertmanager:
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.port == 0:
            self.port = free_port(self.host)
        if isinstance(self.config, str):
            self.config_path.write_text(self.config)
        argv = [
            find_binary("prometheus-alertmanager", ("alertmanager",)),
            f"--config.file={self.config_path}",
            f"--storage.path={self.workdir / 'data'}",
            f"--web.listen-address={self.host}:{self.port}",
            "--cluster.listen-address=",
        ]
        self._proc = ManagedProcess(
            "alertmanager", argv, f"{self.url}/-/ready", self.workdir / "alertmanager.log"
        )
        self._proc.start(timeout)
        return self

    def alerts(self) -> list[dict[str, Any]]:
        """Every alert Alertmanager holds (v2 API objects: labels, annotations, status, ...)."""
        return list(get_json(f"{self.url}/api/v2/alerts"))

    def post_alerts(self, alerts: Sequence[Mapping[str, Any]]) -> None:
        """Send alerts as Prometheus would (each: labels, annotations, startsAt, ...)."""
        http_post(f"{self.url}/api/v2/alerts", json.dumps(list(alerts)).encode())
