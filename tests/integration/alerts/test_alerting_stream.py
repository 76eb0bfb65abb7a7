"""A real stream worker's detections become alerts: simulated fleet -> Kafka -> `stepwatch
stream` -> real Prometheus with the shipped rules -> real Alertmanager -> the remediator's
webhook. A NaN loss is a user error (notify, class user); a slow GPU is a straggler to drain."""

from __future__ import annotations

import time

import pytest

from stepwatch.alerts.config import Receivers, alertmanager_config, rule_files
from stepwatch.contract import EventMessage, EventType
from stepwatch.daemons.prometheus import wait_for
from stepwatch.kafka import ensure_topics
from stepwatch.sim import Fault, FaultKind, Scenario, simulate
from tests.support.alert_support import WebhookReceiver
from tests.support.stream_support import StreamWorker, publish


def fleet() -> list:
    now = time.time()
    user = Scenario(
        seed=3,
        job_id="nan-1",
        nodes=2,
        steps=40,
        start_ts=now - 60,
        faults=(Fault(FaultKind.NAN_LOSS, start_step=25),),
    )
    slow = Scenario(
        seed=4,
        job_id="slow-1",
        nodes=2,
        steps=60,
        start_ts=now - 80,
        hosts=("gpu-a", "gpu-b"),
        faults=(Fault(FaultKind.SLOW_GPU, rank=3, start_step=15, severity=0.3),),
    )
    return [
        m
        for m in simulate(user, slow)
        if not (isinstance(m, EventMessage) and m.type == EventType.JOB_END)
    ]


@pytest.mark.timeout(180)
def test_stream_detections_fire_the_shipped_rules_and_reach_the_remediator(
    settings, tmp_path, prometheus_factory, alertmanager_factory
):
    ensure_topics(settings)
    token = tmp_path / "token"
    token.write_text("stream-test-token")
    worker = StreamWorker(settings, tmp_path, "w").start()
    try:
        with WebhookReceiver() as hooks:
            am = alertmanager_factory(
                alertmanager_config(
                    Receivers(
                        hooks.url("/remediator"),
                        str(token),
                        hooks.url("/page"),
                        hooks.url("/ticket"),
                    ),
                    fast=True,
                )
            )
            prom = prometheus_factory(
                targets=[f"127.0.0.1:{worker.port}"],
                rule_files=rule_files(),
                alertmanagers=[am.address],
                job_name="stepwatch-stream",
            )
            published = time.monotonic()
            publish(settings, fleet())
            user = wait_for(lambda: prom.firing("JobUserError"), 90, what="JobUserError")[0]
            t_user = time.monotonic() - published
            assert user.labels["job_id"] == "nan-1" and user.labels["class"] == "user"
            assert user.labels["remediation"] == "notify"
            straggler = wait_for(
                lambda: prom.firing("StragglerPersistent"), 90, what="StragglerPersistent"
            )[0]
            t_straggler = time.monotonic() - published
            assert straggler.labels["job_id"] == "slow-1" and straggler.labels["rank"] == "3"
            assert straggler.labels["cause"] == "gpu" and straggler.labels["remediation"] == "drain"

            def delivered() -> set[str]:
                return {n for d in hooks.received("/remediator") for n in d.alertnames()}

            got = wait_for(
                lambda: delivered() >= {"JobUserError", "StragglerPersistent"} and delivered(),
                30,
                what="both alerts at the remediator",
            )
            assert got == {"JobUserError", "StragglerPersistent"}
            print(
                f"\npublished -> firing: JobUserError {t_user:.1f} s (for: 0), "
                f"StragglerPersistent {t_straggler:.1f} s (for: 30s); -> remediator webhook "
                f"{time.monotonic() - published:.1f} s"
            )
            assert all(
                d.authorization == "Bearer stream-test-token" for d in hooks.received("/remediator")
            )
    finally:
        assert worker.stop() == 0, worker.log[-3000:]
