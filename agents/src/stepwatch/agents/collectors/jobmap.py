"""The hpc-job mapping directory: which job owns each local GPU.

The Slurm prolog (``deploy/slurm/prolog.sh``) writes one file per allocated GPU
index, named by the index and holding the job id on its first line, and the
epilog removes them: dcgm-exporter's ``--hpc-job-mapping-dir`` convention (its
``hpc_job`` label). :class:`JobMap` reads that directory for the collectors, so
GPU samples carry the job before the first step arrives and for jobs that do
not use the step SDK. The directory is re-read only when its modification time
changes (the prolog's write-then-rename and the epilog's removals both change it).
A missing directory is an empty mapping; a read error is logged once and the
last good mapping is kept.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

MAX_JOB_ID_CHARS = 128


class JobMap:
    """GPU index -> job id, from a mapping directory."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self._mtime_ns: int | None = None
        self._jobs: dict[int, str] = {}
        self._warned = False

    def read(self) -> dict[int, str]:
        """The current mapping (a copy); empty when the directory does not exist."""
        try:
            mtime_ns = self.directory.stat().st_mtime_ns
        except FileNotFoundError:
            self._mtime_ns, self._jobs = None, {}
            return {}
        except OSError as err:
            self._warn(err)
            return dict(self._jobs)
        if mtime_ns != self._mtime_ns:
            try:
                self._jobs = read_job_map(self.directory)
                self._mtime_ns = mtime_ns
            except OSError as err:
                self._warn(err)
        return dict(self._jobs)

    def _warn(self, err: OSError) -> None:
        if not self._warned:
            self._warned = True
            log.warning("job mapping directory unreadable dir=%s err=%r", self.directory, err)


def read_job_map(directory: Path) -> dict[int, str]:
    """Read every ``<gpu index>`` file once; other names, empty files and odd ids are skipped."""
    jobs: dict[int, str] = {}
    with os.scandir(directory) as entries:
        for entry in entries:
            if not entry.name.isdigit() or not entry.is_file():
                continue
            try:
                with open(entry.path, encoding="utf-8", errors="replace") as f:
                    job = f.readline(MAX_JOB_ID_CHARS + 1).strip()
            except FileNotFoundError:  # removed by an epilog meanwhile
                continue
            if job and len(job) <= MAX_JOB_ID_CHARS and job.isprintable():
                jobs[int(entry.name)] = job
    return jobs
