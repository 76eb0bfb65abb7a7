"""Fault-to-action latency through the whole pipeline, each stage measured.

A simulated two-node job, paced in real time (1 step/s) and running as a real
Slurm job on node01-02, gets a slow GPU on node02 at a known wall-clock time.
Its telemetry goes to Kafka (development broker) -> a stream worker ->
Prometheus (scrape and evaluation every --interval s, the shipped rules) ->
Alertmanager (shipped routing, remediator route group_wait --group-wait) ->
the remediator (execute) -> ``scontrol`` on a real 4-node Slurm cluster.

  detection   fault -> the straggler's detection series is > 0 in Prometheus
              (the core's k-of-n persistence + one scrape)
  rule        detection -> StragglerPersistent firing (the rule's ``for: 30s``
              + evaluation)
  grouping    firing -> webhook at the remediator (Alertmanager group_wait + send)
  decision    webhook -> first actuator call (policy, guardrails, state)
  actuator    scontrol drain + requeue

Run: ``python bench/bench_remediate.py`` first (Alertmanager/remediator/Slurm
stages, several repeats), this one for the whole path (one fault, ~75 s; root,
Slurm + munge, Prometheus, Alertmanager installed). Timings are polled every
0.2 s. The knob that trades speed for false actions is the persistence: the
rule's ``for:`` and the core's k-of-n.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from bench_remediate import POLICY, Timed, remediator_and_alertmanager, rule_for_seconds

from stepwatch.alerts.config import rule_files
from stepwatch.alerts.remediate.actuators.slurm import SlurmActuator
from stepwatch.contract import KIND_OF, Topics, encode, message_key
from stepwatch.daemons.broker import DevBroker
from stepwatch.daemons.process import free_port
from stepwatch.daemons.prometheus import Prometheus, wait_for
from stepwatch.daemons.slurm import SlurmCluster
from stepwatch.kafka import ensure_topics, producer_config
from stepwatch.settings import Settings
from stepwatch.sim import Fault, FaultKind, Scenario, simulate
from stepwatch.sim.pacing import paced

ROOT = Path(__file__).resolve().parents[1]
FAULT_STEP = 15


def feed(settings: Settings, scenario: Scenario, stop: threading.Event) -> None:
    from confluent_kafka import Producer

    topics = Topics(settings.topic_prefix)
    producer = Producer(producer_config(settings, **{"linger.ms": 5}))
    for msg in paced(simulate(scenario), 1.0, scenario.start_ts, sleep=lambda s: stop.wait(s)):
        if stop.is_set():
            break
        producer.produce(
            topics.for_kind(KIND_OF[type(msg)]),
            encode(msg),
            key=message_key(msg),
            timestamp=int(msg.ts * 1000),
        )
        producer.poll(0)
    producer.flush(10)


def first(probe: Callable[[], object], timeout: float = 150.0) -> float:
    wait_for(probe, timeout, interval=0.2, what="the next stage")
    return time.time()


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--interval", default="1s", help="Prometheus scrape and evaluation interval")
    ap.add_argument(
        "--group-wait", default="1s", help="the remediator route's group_wait (shipped: 5s)"
    )
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-remediate-full-"))
    received: list[float] = []
    stop = threading.Event()
    with DevBroker() as broker, SlurmCluster(work / "slurm", nodes=4) as slurm:
        settings = Settings.load(
            env={},
            bootstrap_servers=broker.bootstrap,
            topic_prefix="bench",
            partitions=2,
            remediate_policy=str(work / "policy.yaml"),
            remediate_token_file=str(work / "token"),
            remediate_state_dir=str(work / "state"),
        )
        ensure_topics(settings)
        (work / "policy.yaml").write_text(POLICY % slurm.conf_path)
        (work / "token").write_text("bench-token")
        port = free_port()
        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "stepwatch.cli",
                "--log-level",
                "WARNING",
                "stream",
                "--bootstrap-servers",
                broker.bootstrap,
                "--topic-prefix",
                "bench",
                "--partitions",
                "2",
                "--metrics-port",
                str(port),
                "--app-id",
                "bench-remediate",
                "--worker-name",
                "w",
                "--data-dir",
                str(work / "w"),
            ],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=open(work / "worker.log", "ab"),  # noqa: SIM115
            env={**os.environ, "STEPWATCH_HANG_MIN_SECONDS": "3600"},
        )
        timed = Timed(SlurmActuator(conf=str(slurm.conf_path)))
        svc, am = remediator_and_alertmanager(settings, work, timed, args.group_wait, received)
        prom = Prometheus(
            workdir=work / "prom",
            targets=[f"127.0.0.1:{port}"],
            rule_files=rule_files(),
            alertmanagers=[am.address],
            scrape_interval=args.interval,
            evaluation_interval=args.interval,
            job_name="stepwatch-stream",
        ).start()
        try:
            job = slurm.sbatch(
                "-N",
                "2",
                "-w",
                "node[01-02]",
                "--requeue",
                "-o",
                "/dev/null",
                "--wrap",
                "sleep 600",
            )
            wait_for(
                lambda: "JobState=RUNNING" in slurm.scontrol("show", "job", job, "-o"),
                30,
                what="job",
            )
            wait_for(
                lambda: (
                    prom.target_health() and all(h == "up" for h in prom.target_health().values())
                ),
                60,
                what="worker scraped",
            )
            start = time.time() + 1
            scenario = Scenario(
                seed=4,
                job_id=job,
                nodes=2,
                steps=120,
                start_ts=start,
                hosts=("node01", "node02"),
                eval_every=0,
                checkpoint_every=0,
                faults=(Fault(FaultKind.SLOW_GPU, rank=11, start_step=FAULT_STEP, severity=0.3),),
            )
            feeder = threading.Thread(target=feed, args=(settings, scenario, stop), daemon=True)
            feeder.start()
            fault = start + FAULT_STEP * scenario.step_seconds
            t_detect = first(
                lambda: prom.query('stepwatch_detection_score{type="straggler",host="node02"} > 0')
            )
            t_fire = first(lambda: prom.firing("StragglerPersistent"))
            wait_for(lambda: len(timed.calls) >= 2, 60, interval=0.2, what="drain + requeue")
            t_hook = received[0]
            (_, drain_at, _), (_, req_at, req_took) = timed.calls[:2]
        finally:
            stop.set()
            prom.stop()
            am.stop()
            svc.stop()
            worker.terminate()
            worker.wait(30)
    stages = [
        ("detection", t_detect - fault, "core persistence + scrape"),
        (
            "rule evaluation",
            t_fire - t_detect,
            f"for: {rule_for_seconds('StragglerPersistent'):.0f} s, every {args.interval}",
        ),
        ("AM grouping", t_hook - t_fire, f"group_wait {args.group_wait}"),
        ("decision", drain_at - t_hook, "policy, guardrails, state"),
        ("actuator", req_at + req_took - drain_at, "scontrol drain + requeue"),
    ]
    total = sum(s[1] for s in stages)
    print("fault-to-action through the whole pipeline (one fault, polled every 0.2 s):")
    for name, secs, how in stages:
        print(f"  {name:16s}{secs:7.2f} s  {how}")
    print(f"  {'total':16s}{total:7.2f} s  (goal < 60 s)")
    return 0 if total < 60 else 1


if __name__ == "__main__":
    sys.exit(main())
