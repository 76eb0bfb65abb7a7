"""Job figures for the live view, read from the stream workers' own /metrics."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field

FIGURES = {
    "stepwatch_job_step_seconds": "step_s",
    "stepwatch_job_tokens_per_second": "tokens_per_s",
    "stepwatch_job_samples_per_second": "samples_per_s",
    "stepwatch_job_mfu_ratio": "mfu",
    "stepwatch_job_goodput_ratio": "goodput",
    "stepwatch_job_last_step": "last_step",
    "stepwatch_job_world_size": "world_size",
    "stepwatch_job_stragglers": "stragglers",
    "stepwatch_job_hung": "hung",
}


@dataclass
class JobFigures:
    job_id: str
    values: dict[str, float] = field(default_factory=dict)

    def get(self, name: str) -> float | None:
        return self.values.get(name)


def scrape_jobs(targets: Iterable[str], timeout: float = 1.0) -> list[JobFigures]:
    """The job gauges of every reachable worker; an unreachable one is skipped."""
    from prometheus_client.parser import text_string_to_metric_families

    jobs: dict[str, JobFigures] = {}
    for target in targets:
        try:
            with urllib.request.urlopen(f"http://{target}/metrics", timeout=timeout) as resp:
                text = resp.read().decode()
        except OSError:
            continue
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                name = FIGURES.get(sample.name)
                job = sample.labels.get("job_id")
                if name and job:
                    jobs.setdefault(job, JobFigures(job)).values[name] = sample.value
    return sorted(jobs.values(), key=lambda j: j.job_id)
