"""The agent's per-GPU and per-port series as Prometheus text, and reading values back."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from stepwatch.agents.host_series import HostSeries, families


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(text: str, name: str, **labels: str) -> float | None:
    """The one series ``name`` whose labels include ``labels`` (None: there is none)."""
    want = set(labels.items())
    found = [v for (n, ls), v in samples(text).items() if n == name and want <= ls]
    assert len(found) <= 1, f"{name}{labels} matched {len(found)} series"
    return found[0] if found else None


def render_series(series: HostSeries, host: str = "node01") -> str:
    """What the agent's /metrics shows of ``series`` (the host series families only)."""

    class C:
        def collect(self) -> Any:
            return families(host, series.view())

    reg = CollectorRegistry(auto_describe=False)
    reg.register(C())
    return generate_latest(reg).decode()
