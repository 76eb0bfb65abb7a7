"""Prometheus text exposition -> flat samples, line by line, tolerant of damage.

Label sets are parsed by ``prometheus_client.parser`` (escapes, quoting and
validation are its business). An exporter repeats the same few label sets on
every family (dcgm-exporter: one per GPU), so each distinct ``{...}`` block is
parsed once and cached: a page of 200 samples costs 8 label parses, not 200.
A damaged line is skipped and counted; the rest of the page survives.
Comment lines (``# HELP``/``# TYPE``) are skipped; names are kept as written
(no ``_total`` added to counters).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
_CACHE_MAX = 4096


@dataclass(frozen=True)
class Sample:
    """One sample: its metric name as written, labels, value."""

    family: str
    labels: dict[str, str]
    value: float


@dataclass(frozen=True)
class Page:
    samples: list[Sample]
    bad_lines: int = 0
    first_bad: str = ""


class Parser:
    """A page parser that remembers the label blocks it has seen."""

    def __init__(self) -> None:
        self._labels: dict[str, dict[str, str]] = {}

    def parse(self, text: str) -> Page:
        out: list[Sample] = []
        bad = 0
        first_bad = ""
        for line in text.splitlines():
            if not line or line[0] == "#" or line.isspace():
                continue
            try:
                out.append(self._sample(line))
            except ValueError:
                bad += 1
                first_bad = first_bad or line.strip()[:120]
        return Page(out, bad, first_bad)

    def _sample(self, line: str) -> Sample:
        brace = line.find("{")
        if brace < 0:
            name, _, rest = line.strip().partition(" ")
            labels: dict[str, str] = {}
        else:
            end = line.rfind("}")
            if end < brace:
                raise ValueError("unterminated label set")
            name, rest = line[:brace].strip(), line[end + 1 :]
            labels = self._label_set(line[brace : end + 1])
        if not _NAME.match(name):
            raise ValueError(f"bad metric name {name!r}")
        parts = rest.split()
        if not 1 <= len(parts) <= 2:
            raise ValueError("expected a value and an optional timestamp")
        return Sample(name, labels, float(parts[0]))

    def _label_set(self, block: str) -> dict[str, str]:
        labels = self._labels.get(block)
        if labels is None:
            families = list(text_string_to_metric_families(f"x{block} 0\n"))
            if len(families) != 1 or len(families[0].samples) != 1:
                raise ValueError("bad label set")
            labels = dict(families[0].samples[0].labels)
            if len(self._labels) >= _CACHE_MAX:
                self._labels.clear()
            self._labels[block] = labels
        return labels


def parse(text: str) -> Page:
    """Parse one page with a fresh parser (no label cache carried over)."""
    return Parser().parse(text)
