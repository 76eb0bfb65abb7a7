"""Match detections to ground-truth labels and compute the benchmark's figures.

A detection (its ``open`` message) is a hit for a label when it is about the
same job, its type is the label's expected type or one the label accepts, it
points at the right place (a rank among the label's ranks; the host, for link
flaps; anything, for job-level labels and job-level detections), and it opened
no earlier than the fault's start (1 s tolerance) and no later than a minute
after the fault ended. Every other detection is a false detection. Time to
detect is from the fault's start to the first hit; attribution is right when
that first hit's cause is the label's cause.

A host-level detection (``rank`` null, ``ranks`` listed) hits a label whose
ranks it shares or whose host it names; a network ``job_slowdown`` hits a
network label only when it names the label's host. A detection that carries
``related`` (it belongs to another open incident) is not an incident of its
own: it is neither a hit nor a false detection. *Duplicates* count the extra
incidents that hit a label already hit.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from stepwatch.contract import DetectionMessage
from stepwatch.quality.suite import SLOWDOWNS
from stepwatch.quality.suite import BenchCase as Case
from stepwatch.sim import Label

JOB_LEVEL = frozenset({"job_slowdown", "hang", "user_error"})
NETWORK_TYPES = frozenset({"network_congestion", "link_errors"})
# faults reported the moment they happen (no onset to estimate)
INSTANT_KINDS = frozenset({"link_flap", "xid79", "xid48", "rank_crash", "job_hang", "nan_loss"})
SLOWDOWN_KINDS = frozenset(k.value for k in SLOWDOWNS)
START_TOLERANCE_S = 1.0
END_GRACE_S = 60.0


@dataclass
class CaseResult:
    case: Case
    labels: list[Label]
    detections: list[DetectionMessage]
    messages: int
    records: int
    seconds: float
    suspects: int = 0  # straggler suspects seen (JobStats.suspects_total): not incidents

    @property
    def opened(self) -> list[DetectionMessage]:
        """The incidents opened (a detection linked to another incident is not one)."""
        return [d for d in self.detections if d.state == "open" and not d.related]

    @property
    def job_hours(self) -> float:
        return self.case.job_hours


def hits(label: Label, d: DetectionMessage) -> bool:
    types = (label.detection, *label.accepted)
    if label.cause == "network":  # a port found from its counters: by its host
        types = (*types, *NETWORK_TYPES)
    if d.job_id != label.job_id or d.type not in types:
        return False
    if d.ts < label.start_ts - START_TOLERANCE_S:
        return False
    if label.end_ts is not None and d.ts > label.end_ts + END_GRACE_S:
        return False
    if d.type == "link_flap" or d.type in NETWORK_TYPES:
        return d.host == label.host
    if d.type == "job_slowdown" and label.cause == "network" and label.host:
        return d.host == label.host
    if d.rank is None and d.ranks:
        return bool(set(d.ranks) & set(label.ranks)) or (bool(label.host) and d.host == label.host)
    if d.rank is None:
        return d.type in JOB_LEVEL
    return not label.ranks or d.rank in label.ranks


@dataclass
class Outcome:
    label: Label
    case: Case
    first: DetectionMessage | None

    @property
    def ttd_steps(self) -> float | None:
        if self.first is None:
            return None
        return max(0, (self.first.step or 0) - self.label.start_step)

    @property
    def ttd_seconds(self) -> float | None:
        return None if self.first is None else max(0.0, self.first.ts - self.label.start_ts)

    @property
    def cause_ok(self) -> bool | None:
        return None if self.first is None else self.first.cause == self.label.cause


def evaluate(
    results: list[CaseResult],
) -> tuple[list[Outcome], list[tuple[Case, DetectionMessage]], int]:
    """Outcomes per label, false detections, and the number of true detections."""
    outcomes, false, true, _ = _evaluate(results)
    return outcomes, false, true


def duplicates(results: list[CaseResult]) -> int:
    return _evaluate(results)[3]


def _evaluate(
    results: list[CaseResult],
) -> tuple[list[Outcome], list[tuple[Case, DetectionMessage]], int, int]:
    outcomes: list[Outcome] = []
    false: list[tuple[Case, DetectionMessage]] = []
    true = dups = 0
    for r in results:
        opened = sorted(r.opened, key=lambda d: d.ts)
        for d in opened:
            if any(hits(label, d) for label in r.labels):
                true += 1
            else:
                false.append((r.case, d))
        for label in r.labels:
            dups += max(0, sum(1 for d in opened if hits(label, d)) - 1)
        for label in r.labels:
            first = next((d for d in opened if hits(label, d)), None)
            outcomes.append(Outcome(label, r.case, first))
    return outcomes, false, true, dups


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def summarise(results: list[CaseResult]) -> dict[str, Any]:
    outcomes, false, true, dups = _evaluate(results)
    detected = [o for o in outcomes if o.first is not None]
    total = true + len(false)
    precision = true / total if total else 1.0
    recall = len(detected) / len(outcomes) if outcomes else 1.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    steps = [float(o.ttd_steps) for o in detected if o.ttd_steps is not None]
    secs = [o.ttd_seconds for o in detected if o.ttd_seconds is not None]
    causes = [o.cause_ok for o in detected]
    healthy = [r for r in results if r.case.healthy]
    hours = sum(r.job_hours for r in healthy)
    healthy_false = sum(len(r.opened) for r in healthy)
    healthy_suspects = sum(r.suspects for r in healthy)
    onsets = [
        abs(o.first.first_step - o.label.start_step)
        for o in detected
        if o.first is not None
        and o.first.first_step is not None
        and o.label.kind not in INSTANT_KINDS
    ]
    net = [o for o in outcomes if o.label.cause == "network" and o.label.kind not in INSTANT_KINDS]
    return {
        "labels": len(outcomes),
        "detected": len(detected),
        "detections": total,
        "false_detections": len(false),
        "duplicates": dups,
        "precision": round(precision, 4),
        "recall": round(recall, 4),
        "f1": round(f1, 4),
        "ttd_steps_median": _pct(steps, 0.5),
        "ttd_steps_p95": _pct(steps, 0.95),
        "ttd_seconds_median": _r(_pct(secs, 0.5)),
        "ttd_seconds_p95": _r(_pct(secs, 0.95)),
        "attribution": round(sum(1 for c in causes if c) / len(causes), 4) if causes else None,
        "healthy_job_hours": round(hours, 2),
        "healthy_detections": healthy_false,
        "false_per_1000_healthy_job_hours": round(1000 * healthy_false / hours, 1)
        if hours
        else None,
        "detections_per_healthy_job_hour": round(healthy_false / hours, 3) if hours else None,
        "suspects_per_healthy_job_hour": round(healthy_suspects / hours, 3) if hours else None,
        # |first_step - the fault's first step| <= 3 (instant kinds left out)
        "onset_within_3": round(sum(1 for x in onsets if x <= 3) / len(onsets), 4)
        if onsets
        else None,
        # network faults (not link flaps) found and pinned to their host, any slowdown
        "network_localized": round(sum(1 for o in net if o.first is not None) / len(net), 4)
        if net
        else None,
    }


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


def score(results: list[CaseResult]) -> dict[str, Any]:
    strong = [r for r in results if r.case.severity is None or r.case.severity >= 0.10]
    slowdowns = [r for r in results if r.case.severity is not None]
    slow_strong = [r for r in slowdowns if (r.case.severity or 0) >= 0.10] + [
        r for r in results if r.case.healthy
    ]
    outcomes, false, _ = evaluate(results)
    per_kind: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"n": 0, "hit": 0, "cause": 0, "ttd": []}
    )
    for o in outcomes:
        slowdown = o.label.kind in SLOWDOWN_KINDS
        sev = f"@{round(o.label.severity * 100)}%" if slowdown else ""
        row = per_kind[o.label.kind + sev]
        row["n"] += 1
        if o.first is not None:
            row["hit"] += 1
            row["cause"] += bool(o.cause_ok)
            row["ttd"].append(o.ttd_steps)
    return {
        "overall": summarise(results),
        "severity_ge_10pct": summarise(strong),
        "slowdowns_ge_10pct": summarise(slow_strong),
        "per_kind": {
            k: {
                "labels": v["n"],
                "detected": v["hit"],
                "cause_ok": v["cause"],
                "ttd_steps_median": _pct([float(t) for t in v["ttd"]], 0.5),
            }
            for k, v in sorted(per_kind.items())
        },
        "misses": [f"{o.case.name}: {o.label.summary}" for o in outcomes if o.first is None],
        "wrong_cause": [
            f"{o.case.name}: expected {o.label.cause}, got {o.first.cause} ({o.first.summary})"
            for o in outcomes
            if o.first is not None and not o.cause_ok
        ],
        "false": [f"{c.name}: {d.type} rank={d.rank} step={d.step} {d.summary}" for c, d in false],
        "engine_seconds": round(sum(r.seconds for r in results), 2),
        "messages": sum(r.messages for r in results),
        "records": sum(r.records for r in results),
    }


GOALS = {"precision": 0.98, "recall": 0.95, "ttd_steps_median": 5, "attribution": 0.9}


def report_lines(f: dict[str, Any], verbose: bool = False, micro_only: bool = False) -> list[str]:
    if micro_only:
        return _micro_lines(f)
    s = f.get("suite", {})
    out = [
        f"detection quality: family {s.get('family', 'sim')}, {s.get('mode')} suite, "
        f"seed {s.get('seed')}, {s.get('cases')} "
        f"jobs, {f['messages']} messages, {f['records']} step records, "
        f"{s.get('seconds')} s (engine+simulator)",
        "",
    ]
    cols = (
        "precision",
        "recall",
        "f1",
        "duplicates",
        "ttd_steps_median",
        "ttd_steps_p95",
        "ttd_seconds_median",
        "ttd_seconds_p95",
        "attribution",
        "detections_per_healthy_job_hour",
    )
    out.append(f"{'subset':<22}{'labels':>7}{'dets':>6}" + "".join(f"{c[:12]:>13}" for c in cols))
    for name in ("overall", "severity_ge_10pct", "slowdowns_ge_10pct"):
        row = f[name]
        out.append(
            f"{name:<22}{row['labels']:>7}{row['detections']:>6}"
            + "".join(f"{_fmt(row[c]):>13}" for c in cols)
        )
    g = f["slowdowns_ge_10pct"]
    out.append("")
    out.append(
        "goals on slowdowns >= 10 %: "
        + ", ".join(
            f"{k} {_fmt(g[k])} ({'met' if _met(k, g[k]) else 'NOT met'}, goal "
            f"{'<=' if k.startswith('ttd') else '>='} {v})"
            for k, v in GOALS.items()
        )
    )
    healthy = f["overall"]
    out.append(f"duplicates: {g['duplicates']} (goal: 0)")
    out.append(
        f"healthy runs: {healthy['healthy_detections']} detections in "
        f"{healthy['healthy_job_hours']} job-hours (goal: 0)"
    )
    out.append("")
    out.append(f"{'fault':<28}{'labels':>7}{'detected':>9}{'cause ok':>9}{'ttd steps':>10}")
    for kind, row in f["per_kind"].items():
        out.append(
            f"{kind:<28}{row['labels']:>7}{row['detected']:>9}{row['cause_ok']:>9}"
            f"{_fmt(row['ttd_steps_median']):>10}"
        )
    for title, key in (
        ("missed", "misses"),
        ("wrong cause", "wrong_cause"),
        ("false detections", "false"),
    ):
        items = f[key]
        if items:
            out.append("")
            out.append(f"{title} ({len(items)}):")
            out.extend(f"  {x}" for x in (items if verbose else items[:8]))
            if not verbose and len(items) > 8:
                out.append(f"  ... {len(items) - 8} more (--verbose)")
    out.extend(_micro_lines(f))
    return out


def _micro_lines(f: dict[str, Any]) -> list[str]:
    out: list[str] = []
    if "micro" in f:
        out.append("")
        out.append("Engine.process micro-benchmark (step messages only, best of 3):")
        for m in f["micro"]:
            out.append(
                f"  {m['ranks']:>5} ranks: {m['engine_records_per_s']:>9,} records/s "
                f"({m['engine_us_per_record']} us/record); msgspec decode of the same "
                f"messages {m['decode_records_per_s']:,} records/s; "
                f"engine/decode = {m['engine_over_decode']}"
            )
    return out


def _met(key: str, value: float | None) -> bool:
    if value is None:
        return False
    return value <= GOALS[key] if key.startswith("ttd") else value >= GOALS[key]


def _fmt(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.3g}" if abs(x) < 1000 else f"{x:,.0f}"
    return str(x)
