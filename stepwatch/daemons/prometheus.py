"""The real Prometheus server on a loopback port, with stepwatch's rules.

Starts Debian's ``prometheus`` binary with a generated config (written as JSON,
which is valid YAML) in a private directory: scrape targets, rule files, an
optional Alertmanager, and short scrape/evaluation intervals for tests and the
demo. ``--web.enable-lifecycle`` is on so a config change is a ``reload()``.
Query helpers wrap the HTTP API (``/api/v1/query``, ``/api/v1/alerts``).
"""

from __future__ import annotations

import json
import logging
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from stepwatch.daemons.process import (
    LOOPBACK,
    Daemon,
    ManagedProcess,
    find_binary,
    free_port,
    get_json,
)
from stepwatch.errors import DaemonError

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class Sample:
    """One series of an instant-query result."""

    labels: Mapping[str, str]
    value: float


@dataclass(frozen=True)
class Alert:
    """One active alert as Prometheus reports it (``pending`` or ``firing``)."""

    name: str
    state: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    value: float


# The agent's GPU series carry dcgm-exporter's ``Hostname``; every other series ``host``.
# Every scrape config stepwatch ships copies Hostname into host where host is empty, so
# rules and dashboards match on ``host`` alone (docs/alerts.md).
HOST_FROM_HOSTNAME: dict[str, Any] = {
    "source_labels": ["host", "Hostname"],
    "separator": ";",
    "regex": ";(.+)",
    "target_label": "host",
    "replacement": "$1",
    "action": "replace",
}


@dataclass
class Prometheus(Daemon):
    """A Prometheus process. Use as a context manager; ``url`` once started."""

    workdir: Path
    targets: Sequence[str] = ()  # host:port of /metrics endpoints
    rule_files: Sequence[Path] = ()
    alertmanagers: Sequence[str] = ()  # host:port
    scrape_interval: str = "1s"
    evaluation_interval: str = "1s"
    job_name: str = "stepwatch"
    scrape_jobs: Mapping[str, Sequence[str]] = field(
        default_factory=dict
    )  # more jobs: name -> targets
    port: int = 0
    host: str = LOOPBACK
    _proc: ManagedProcess | None = field(default=None, repr=False)

    @property
    def config_path(self) -> Path:
        return self.workdir / "prometheus.yml"

    def config(self) -> dict[str, Any]:
        """The config this instance runs with, as a mapping."""
        cfg: dict[str, Any] = {
            "global": {
                "scrape_interval": self.scrape_interval,
                "evaluation_interval": self.evaluation_interval,
                "scrape_timeout": self.scrape_interval,
            },
            "rule_files": [str(Path(p).resolve()) for p in self.rule_files],
            "scrape_configs": [
                {
                    "job_name": name,
                    "static_configs": [{"targets": list(targets)}],
                    "metric_relabel_configs": [HOST_FROM_HOSTNAME],
                }
                for name, targets in {self.job_name: self.targets, **self.scrape_jobs}.items()
            ],
        }
        if self.alertmanagers:
            cfg["alerting"] = {
                "alertmanagers": [{"static_configs": [{"targets": list(self.alertmanagers)}]}]
            }
        return cfg

    def start(self, timeout: float = 30.0) -> Prometheus:
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.port == 0:
            self.port = free_port(self.host)
        self._write_config()
        argv = [
            find_binary("prometheus"),
            f"--config.file={self.config_path}",
            f"--storage.tsdb.path={self.workdir / 'data'}",
            f"--web.listen-address={self.host}:{self.port}",
            "--web.enable-lifecycle",
            "--storage.tsdb.retention.time=1d",
        ]
        self._proc = ManagedProcess(
            "prometheus", argv, f"{self.url}/-/ready", self.workdir / "prometheus.log"
        )
        self._proc.start(timeout)
        return self

    def _write_config(self) -> None:
        self.config_path.write_text(json.dumps(self.config(), indent=2))

    # --- changes ---------------------------------------------------------------
    def set_targets(self, targets: Sequence[str]) -> None:
        """Replace the scrape targets and reload."""
        self.targets = tuple(targets)
        self._write_config()
        self.reload()

    # --- queries ---------------------------------------------------------------
    def _api(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        body = get_json(f"{self.url}/api/v1/{path}{query}")
        if body.get("status") != "success":
            raise DaemonError(f"prometheus {path} failed: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[Sample]:
        """Instant query: one :class:`Sample` per series (vector or scalar result)."""
        data = self._api("query", query=expr)
        if data["resultType"] == "scalar":
            return [Sample({}, float(data["result"][1]))]
        if data["resultType"] != "vector":
            raise DaemonError(f"unsupported result type {data['resultType']} for {expr}")
        return [Sample(dict(r["metric"]), float(r["value"][1])) for r in data["result"]]

    def query_value(self, expr: str) -> float | None:
        """The value of a single-series query, or None when it returns nothing."""
        samples = self.query(expr)
        if len(samples) > 1:
            raise DaemonError(f"{expr} returned {len(samples)} series, expected at most one")
        return samples[0].value if samples else None

    def alerts(self) -> list[Alert]:
        """Active alerts (pending and firing)."""
        return [
            Alert(
                name=a["labels"].get("alertname", ""),
                state=a["state"],
                labels=dict(a["labels"]),
                annotations=dict(a.get("annotations", {})),
                value=float(a.get("value", "nan")),
            )
            for a in self._api("alerts")["alerts"]
        ]

    def firing(self, name: str | None = None) -> list[Alert]:
        return [a for a in self.alerts() if a.state == "firing" and name in (None, a.name)]

    def rule_groups(self) -> list[dict[str, Any]]:
        return list(self._api("rules")["groups"])

    def target_health(self) -> dict[str, str]:
        """scrape URL -> ``up`` / ``down`` / ``unknown`` for each active target."""
        return {t["scrapeUrl"]: t["health"] for t in self._api("targets")["activeTargets"]}


def wait_for(
    probe: Callable[[], T | None], timeout: float, interval: float = 0.5, what: str = "condition"
) -> T:
    """Poll ``probe`` until it returns something truthy; DaemonError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        got = probe()
        if got:
            return got
        if time.monotonic() >= deadline:
            raise DaemonError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)
