"""Prometheus text exposition -> flat samples, tolerant of damaged lines.

Parsing uses ``prometheus_client.parser``. That parser rejects a whole page for
one bad line; here a page that fails is re-read line by line so every good
sample survives and the bad lines are counted.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True)
class Sample:
    """One sample: its metric family name (no added ``_total``), labels, value."""

    family: str
    labels: dict[str, str]
    value: float


@dataclass(frozen=True)
class Page:
    samples: list[Sample]
    bad_lines: int = 0
    first_bad: str = ""


def parse(text: str) -> Page:
    """All samples of a page; damaged lines are skipped and counted."""
    try:
        return Page(_parse_whole(text))
    except ValueError:
        return _parse_by_line(text)


def _parse_whole(text: str) -> list[Sample]:
    out: list[Sample] = []
    for family in text_string_to_metric_families(text):
        # Counters written without a _total suffix come back with one added to
        # the sample name; the family name is what the exporter wrote.
        single = len({s.name for s in family.samples}) <= 1
        for s in family.samples:
            out.append(Sample(family.name if single else s.name, s.labels, float(s.value)))
    return out


def _parse_by_line(text: str) -> Page:
    out: list[Sample] = []
    bad = 0
    first_bad = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        try:
            for family in text_string_to_metric_families(stripped + "\n"):
                out.extend(Sample(s.name, s.labels, float(s.value)) for s in family.samples)
        except ValueError:
            bad += 1
            first_bad = first_bad or stripped[:120]
    return Page(out, bad, first_bad)
