"""A real job's first long checkpoint save is not a hang; a real hang still is.

``examples/ddp_train.py`` (4 ranks, gloo on CPU, 2 emulated hosts, real agents,
broker and stream worker) saves a checkpoint on rank 0 at step 20 that takes 15 s
(``--slow-checkpoint``: slow storage) while the other ranks wait in the next
step's all-reduce. The worker's hang limit is 5 s. Before, the SDK said nothing
until the save ended, so the worker called the job hung 5 s into its first save
(and ``JobHang`` requeues); ``sw.checkpoint`` now sends ``checkpoint_begin`` as
the save starts and nothing opens. The control in the same pipeline: a job whose
rank 0 then stops stepping without a checkpoint is called hung.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("torch")

from stepwatch.settings import Settings
from tests.support.stream_support import StreamWorker, wait_for
from tests.support.torch_jobs import (
    Agents,
    Fault,
    detections,
    run_job,
    torch_pipeline,
)

pytestmark = [pytest.mark.integration, pytest.mark.serial]  # timing-sensitive: run alone

HANG_LIMIT = 5.0
SAVE_SECONDS = 15.0
STEPS = 40


@pytest.fixture(scope="module")
def pipeline(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Settings, Agents, Path, StreamWorker]]:
    work = tmp_path_factory.mktemp("torch-ckpt")
    env = {"STEPWATCH_HANG_MIN_SECONDS": str(HANG_LIMIT)}
    with torch_pipeline(work, worker_env=env) as (settings, agents, worker):
        yield settings, agents, work, worker


def opened_by(pipeline, name: str, *more: str) -> list[str]:  # type: ignore[no-untyped-def]
    """Run the example with a 15 s save at step 20 (``more`` flags too); the types of the
    detections the worker opened for it, once it closed the job's last step."""
    settings, agents, work, worker = pipeline
    job = f"{name}-{int(time.time())}"
    options = (
        "--checkpoint-dir",
        str(work / job),
        "--checkpoint-every",
        "20",
        "--slow-checkpoint",
        str(SAVE_SECONDS),
        *more,
    )
    started = time.monotonic()
    run_job(agents, job, Fault("healthy", options=options), STEPS, work)
    assert time.monotonic() - started > SAVE_SECONDS  # the save really held the job
    wait_for(
        "the worker closed the job's last step",
        lambda: worker.value("stepwatch_job_last_step", job_id=job) >= STEPS - 1,
        60,
        [worker],
    )
    time.sleep(2)
    return [str(d["type"]) for d in detections(settings, job) if d["state"] == "open"]


@pytest.mark.timeout(420)
def test_a_first_15_s_checkpoint_save_is_no_hang(pipeline) -> None:  # type: ignore[no-untyped-def]
    assert opened_by(pipeline, "ckpt") == []


@pytest.mark.timeout(420)
def test_the_same_save_unreported_is_a_hang(pipeline) -> None:  # type: ignore[no-untyped-def]
    """The same 15 s save with no ``sw.checkpoint`` around it (a framework that does not
    report its saves): the worker knows of no save in progress, and the job is hung."""
    assert "hang" in opened_by(pipeline, "stall", "--checkpoint-unreported")
