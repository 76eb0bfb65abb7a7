"""Wire the remediator from settings: policy, token, state, actuators, audit, server."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry

from stepwatch.alerts.remediate import actuators
from stepwatch.alerts.remediate import policy as policy_mod
from stepwatch.alerts.remediate.actuators.base import Actuator
from stepwatch.alerts.remediate.audit import Audit, KafkaWriter, Metrics, Writer
from stepwatch.alerts.remediate.engine import Remediator
from stepwatch.alerts.remediate.model import Mode
from stepwatch.alerts.remediate.outcome import OutcomeTimer, OutcomeTracker
from stepwatch.alerts.remediate.server import RemediatorServer
from stepwatch.alerts.remediate.state import State
from stepwatch.errors import ConfigError, StepwatchError
from stepwatch.settings import Settings

log = logging.getLogger(__name__)


def read_token(settings: Settings) -> str:
    """The bearer token: ``remediate_token_file`` (first line) else ``remediate_token``."""
    if settings.remediate_token_file:
        try:
            token = Path(settings.remediate_token_file).read_text().strip()
        except OSError as err:
            raise ConfigError(f"remediate_token_file: cannot read: {err.strerror}") from err
    else:
        token = settings.remediate_token.strip()
    if not token:
        raise ConfigError(
            "the remediator needs a bearer token: set remediate_token_file "
            "(or STEPWATCH_REMEDIATE_TOKEN)"
        )
    return token


def audit_writers(settings: Settings) -> list[Writer]:
    """The audit topic when Kafka is configured; the sink stores it (remediation_actions)."""
    writers: list[Writer] = []
    if settings.bootstrap_servers:
        from stepwatch.contract.topics import Topics
        from stepwatch.kafka import ensure_topics

        topic = Topics(settings.topic_prefix).remediations
        try:
            ensure_topics(settings, [topic])
        except StepwatchError as err:  # Kafka down at start: decide anyway, count what is lost
            log.error("audit topic not verified topic=%s error=%s", topic, err)
        writers.append(KafkaWriter.from_settings(settings))
    return writers


@dataclass
class Service:
    server: RemediatorServer
    audit: Audit
    state: State
    timer: OutcomeTimer

    @property
    def url(self) -> str:
        return self.server.url

    def stop(self) -> None:
        self.server.stop()
        self.timer.stop()
        self.audit.close()
        self.state.close()


def build(
    settings: Settings,
    *,
    port: int | None = None,
    actuator: Actuator | None = None,
    writers: list[Writer] | None = None,
) -> Service:
    policy = policy_mod.load(settings.remediate_policy)
    mode = Mode(settings.remediate_mode) if settings.remediate_mode else policy.mode
    token = read_token(settings)
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    audit = Audit(metrics, audit_writers(settings) if writers is None else writers)
    state = State(settings.remediate_state_dir)
    audit.breaker(state.breaker().open)
    pager = actuators.build_notifier(policy.page)
    tracker = OutcomeTracker(state, policy.outcome, pager, audit, mode=mode, registry=registry)
    engine = Remediator(
        policy,
        state,
        actuator or actuators.build(policy.actuator),
        actuators.build_notifier(policy.notify),
        pager,
        audit,
        mode=mode,
        outcomes=tracker,
    )
    server = RemediatorServer(
        engine,
        token,
        registry,
        metrics,
        settings.remediate_bind,
        settings.remediate_port if port is None else port,
    )
    log.info(
        "remediator configured mode=%s rules=%d actuator=%s state=%s",
        mode.value,
        len(policy.rules),
        engine.actuator.name,
        settings.remediate_state_dir,
    )
    timer = OutcomeTimer(tracker, policy.outcome.check_every_s).start()
    return Service(server.start(), audit, state, timer)
