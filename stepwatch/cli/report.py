"""``stepwatch report --job ID``: a post-mortem of one job from the historical store.

Writes one self-contained HTML file (figures embedded) and the same figures as
PNG files: a rank x step heat map of compute time, step time and throughput
over time, the goodput/badput breakdown, detections, alerts and remediation
actions on a timeline, each detection's cause evidence, and the GPU and NIC
signals of the flagged hosts. Reads through the store owner's endpoint while
the sink runs (docs/store.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from stepwatch.cli.common import plain_doc
from stepwatch.cli.db import add_store_flags, store_settings


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "report",
        help="write a post-mortem report (HTML + PNG) of a job",
        description=plain_doc(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example: stepwatch report --job 4242 --out reports/",
    )
    p.add_argument("--job", required=True, help="the job id")
    p.add_argument("--out", default="var/reports", help="output directory (default %(default)s)")
    add_store_flags(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    path = write(store_settings(args), args.job, Path(args.out))
    print(path)
    return 0


def write(settings: Any, job: str, out: Path) -> Path:
    """Open the store as a reader, build the report, return the HTML path.

    A spinner on stderr names the stage while it runs, when stderr is a terminal."""
    from stepwatch.cli.progress import status
    from stepwatch.exporters.clickhouse.access import open_reader
    from stepwatch.report.build import build_report

    with status(f"report {job}: opening the store") as update:
        store = open_reader(settings)
        try:
            return build_report(
                store, job, out, progress=lambda s: update(f"report {job}: {s}")
            ).html
        finally:
            store.close()
