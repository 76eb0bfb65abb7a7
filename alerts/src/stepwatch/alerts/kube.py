"""prometheus-operator objects for kube-prometheus: the rules as ``PrometheusRule``s and the
scrape targets as ``PodMonitor``/``ServiceMonitor``s.

kube-prometheus ignores ``prometheus.io/*`` annotations and plain rule files: it finds
targets through monitors and rules through ``PrometheusRule`` objects. This module builds
them from the shipped rule files, with every ``runbook_url`` rebased on the URL where
your copy of docs/runbooks.md is published. Regenerate with ``make kube`` (or
``python -m stepwatch.alerts.kube --runbook-base-url URL``); ``rules --out DIR`` writes
plain rule files with the same rebasing for a Prometheus that reads files.

Every monitor sets the scrape job name the rules expect (``stepwatch-agent``,
``stepwatch-stream``, ``stepwatch-sink``, ``stepwatch-remediator``) and copies the
agent's dcgm-style ``Hostname`` label into ``host`` (:data:`HOST_FROM_HOSTNAME`).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from stepwatch.alerts.config import DEFAULT_RUNBOOK_BASE_URL, rule_files
from stepwatch.daemons.prometheus import HOST_FROM_HOSTNAME as _HOST_RELABEL

ROOT = Path(__file__).resolve().parents[4]  # the checkout: alerts/src/stepwatch/alerts/kube.py
RULES_OUT = ROOT / "deploy" / "kubernetes" / "prometheus-rules.yaml"
MONITORS_OUT = ROOT / "deploy" / "kubernetes" / "monitors.yaml"
NAMESPACE = "stepwatch"
LABELS = {"app.kubernetes.io/part-of": "stepwatch"}
# The labels kube-prometheus' default Prometheus selects rules by (older releases).
RULE_LABELS = {**LABELS, "prometheus": "k8s", "role": "alert-rules"}
# (job name the rules expect, monitor kind, port name); the selector is app.kubernetes.io/name=job
TARGETS: tuple[tuple[str, str, str], ...] = (
    ("stepwatch-agent", "PodMonitor", "metrics"),
    ("stepwatch-stream", "ServiceMonitor", "metrics"),
    ("stepwatch-sink", "ServiceMonitor", "metrics"),
    ("stepwatch-remediator", "ServiceMonitor", "metrics"),
)
# metric relabeling: dcgm's Hostname copied into host where host is empty (GPU series)
HOST_FROM_HOSTNAME: dict[str, Any] = {
    {"source_labels": "sourceLabels", "target_label": "targetLabel"}.get(k, k): v
    for k, v in _HOST_RELABEL.items()
}


def rebase(rule_doc: dict[str, Any], base_url: str) -> dict[str, Any]:
    """``rule_doc`` (a rule file's mapping) with every runbook_url on ``base_url``."""
    base = base_url.rstrip("/")
    for group in rule_doc["groups"]:
        for rule in group["rules"]:
            notes = rule.get("annotations", {})
            url = notes.get("runbook_url", "")
            if url.startswith(DEFAULT_RUNBOOK_BASE_URL):
                notes["runbook_url"] = base + url[len(DEFAULT_RUNBOOK_BASE_URL) :]
    return rule_doc


def rule_docs(base_url: str = DEFAULT_RUNBOOK_BASE_URL) -> Iterator[tuple[Path, dict[str, Any]]]:
    import yaml

    for path in rule_files():
        yield path, rebase(yaml.safe_load(path.read_text()), base_url)


def prometheus_rules(base_url: str = DEFAULT_RUNBOOK_BASE_URL) -> list[dict[str, Any]]:
    """One ``PrometheusRule`` per shipped rule file."""
    return [
        {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "PrometheusRule",
            "metadata": {
                "name": f"stepwatch-{path.stem}",
                "namespace": NAMESPACE,
                "labels": RULE_LABELS,
            },
            "spec": {"groups": doc["groups"]},
        }
        for path, doc in rule_docs(base_url)
    ]


def monitors() -> list[dict[str, Any]]:
    """A PodMonitor for the agent DaemonSet, ServiceMonitors for the services."""
    out = []
    for job, kind, port in TARGETS:
        endpoint: dict[str, Any] = {
            "port": port,
            "path": "/metrics",
            "interval": "15s",
            "relabelings": [{"action": "replace", "targetLabel": "job", "replacement": job}],
            "metricRelabelings": [HOST_FROM_HOSTNAME],
        }
        if job == "stepwatch-agent":
            # the node's name as host: up{} and the agent's own series get it; honorLabels keeps
            # the agent's own host on its port series (no exported_host)
            endpoint["honorLabels"] = True
            endpoint["relabelings"].append(
                {
                    "action": "replace",
                    "sourceLabels": ["__meta_kubernetes_pod_node_name"],
                    "targetLabel": "host",
                }
            )
        key = "podMetricsEndpoints" if kind == "PodMonitor" else "endpoints"
        out.append(
            {
                "apiVersion": "monitoring.coreos.com/v1",
                "kind": kind,
                "metadata": {"name": job, "namespace": NAMESPACE, "labels": LABELS},
                "spec": {
                    "selector": {"matchLabels": {"app.kubernetes.io/name": job}},
                    key: [endpoint],
                },
            }
        )
    return out


def dump(objects: list[dict[str, Any]], header: str) -> str:
    import yaml

    class _Dumper(yaml.SafeDumper):
        pass

    def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    _Dumper.add_representer(str, _str)
    body = yaml.dump_all(objects, Dumper=_Dumper, sort_keys=False, width=100, explicit_start=True)
    return header + str(body)


HEADER = (
    "# GENERATED by `make kube` (python -m stepwatch.alerts.kube) from {src}: do not edit.\n"
    "# prometheus-operator objects for kube-prometheus (docs/deploy.md); checked against\n"
    "# the operator's CRD schemas in tests/unit/alerts/test_kube_objects.py.\n"
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m stepwatch.alerts.kube",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "what",
        nargs="?",
        choices=["kube", "rules"],
        default="kube",
        help="kube: PrometheusRule + monitor YAML; rules: plain rule files",
    )
    parser.add_argument(
        "--runbook-base-url",
        default=DEFAULT_RUNBOOK_BASE_URL,
        help="where docs/runbooks.md is published (default: %(default)s)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        help=(
            "output folder (default: kube: deploy/kubernetes of the checkout stepwatch "
            "is installed from; rules: ./rules)"
        ),
    )
    args = parser.parse_args(argv)
    if args.what == "rules":
        out = args.out or Path("rules")
        out.mkdir(parents=True, exist_ok=True)
        for path, doc in rule_docs(args.runbook_base_url):
            (out / path.name).write_text(
                dump([doc], HEADER.format(src=f"alerts/src/stepwatch/alerts/rules/{path.name}"))
            )
        return 0
    out_dir = args.out or RULES_OUT.parent
    (out_dir / RULES_OUT.name).write_text(
        dump(
            prometheus_rules(args.runbook_base_url),
            HEADER.format(src="alerts/src/stepwatch/alerts/rules/*.yml"),
        )
    )
    (out_dir / MONITORS_OUT.name).write_text(
        dump(monitors(), HEADER.format(src="alerts/src/stepwatch/alerts/kube.py"))
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
