"""Wire the remediator from settings: policy, tokens, state, actuators, audit, server."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry

from stepwatch.alerts.remediate import actuators
from stepwatch.alerts.remediate import operators as operators_mod
from stepwatch.alerts.remediate import policy as policy_mod
from stepwatch.alerts.remediate.actuators.base import Actuator
from stepwatch.alerts.remediate.audit import Audit, KafkaWriter, Metrics, Writer
from stepwatch.alerts.remediate.engine import Remediator
from stepwatch.alerts.remediate.model import Mode
from stepwatch.alerts.remediate.operators import Operators
from stepwatch.alerts.remediate.outcome import OutcomeTimer, OutcomeTracker
from stepwatch.alerts.remediate.server import RemediatorServer
from stepwatch.alerts.remediate.state import State
from stepwatch.errors import ConfigError, StepwatchError
from stepwatch.settings import Settings

log = logging.getLogger(__name__)


def read_token(settings: Settings) -> str:
    """The webhook's bearer token (what Alertmanager holds): ``remediate_token_file`` else
    ``remediate_token``."""
    token = _secret("remediate_token_file", settings.remediate_token_file, settings.remediate_token)
    if not token:
        raise ConfigError(
            "the remediator needs a bearer token: set remediate_token_file "
            "(or STEPWATCH_REMEDIATE_TOKEN)"
        )
    return token


def read_operator_token(settings: Settings) -> str:
    """The CLI operator's own token: ``remediate_operator_token_file`` else
    ``remediate_operator_token``. The webhook token is not one (the service refuses it)."""
    token = _secret(
        "remediate_operator_token_file",
        settings.remediate_operator_token_file,
        settings.remediate_operator_token,
    )
    if not token:
        raise ConfigError(
            "the operator commands need your operator token: set remediate_operator_token_file "
            "(--token-file, or STEPWATCH_REMEDIATE_OPERATOR_TOKEN); the webhook token is not one"
        )
    return token


def read_operators(settings: Settings, webhook_token: str) -> Operators:
    """The operators file (``remediate_operators_file``); none: no operator endpoint answers.
    An operator token equal to the webhook token is refused: the credentials stay apart."""
    if not settings.remediate_operators_file:
        log.warning(
            "no operators configured: approve, close-breaker and the API refuse every request "
            "(set remediate_operators_file)"
        )
        return Operators()
    found = operators_mod.load(settings.remediate_operators_file)
    if found.holds(webhook_token):
        raise ConfigError(
            "remediate_operators_file: an operator's token is the webhook token; "
            "give each operator a token of their own"
        )
    return found


def _secret(name: str, path: str, value: str) -> str:
    """A secret from a file (stripped) when its path is set, else the value itself."""
    if not path:
        return value.strip()
    try:
        return Path(path).read_text().strip()
    except OSError as err:
        raise ConfigError(f"{name} {path}: cannot read: {err.strerror}") from err


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


def lock_state_dir(state_dir: str) -> int:
    """An exclusive lock on ``<state_dir>/remediator.lock`` for this process (its fd).

    Two remediators on one state dir each ran the same drain and requeue (one alert
    posted to both), and a second one that then failed to start (its port taken) had
    first recorded the running one's action interrupted."""
    import fcntl

    folder = Path(state_dir)
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW  # never through a link
        fd = os.open(folder / "remediator.lock", flags, 0o600)
    except OSError as err:
        raise ConfigError(f"remediate_state_dir {state_dir}: {err.strerror}") from err
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        os.close(fd)
        raise ConfigError(
            f"remediate_state_dir {state_dir}: another remediator uses it "
            "(one remediator per state dir)"
        ) from err
    return fd


@dataclass
class Service:
    server: RemediatorServer
    audit: Audit
    state: State
    timer: OutcomeTimer
    lock_fd: int = -1  # the state dir's lock, held until stop

    @property
    def url(self) -> str:
        return self.server.url

    def stop(self) -> None:
        self.server.stop()
        self.timer.stop()
        self.audit.close()
        self.state.close()
        if self.lock_fd >= 0:
            os.close(self.lock_fd)  # the lock goes with it
            self.lock_fd = -1


def build(
    settings: Settings,
    *,
    port: int | None = None,
    actuator: Actuator | None = None,
    writers: list[Writer] | None = None,
) -> Service:
    """The service, started, holding its state dir's lock (released when it stops, or
    here when it cannot start)."""
    lock_fd = lock_state_dir(settings.remediate_state_dir)
    try:
        service = _build(settings, port, actuator, writers)
    except BaseException:
        os.close(lock_fd)
        raise
    service.lock_fd = lock_fd
    return service


def _build(
    settings: Settings,
    port: int | None,
    actuator: Actuator | None,
    writers: list[Writer] | None,
) -> Service:
    policy = policy_mod.load(settings.remediate_policy)
    mode = Mode(settings.remediate_mode) if settings.remediate_mode else policy.mode
    token = read_token(settings)
    operators = read_operators(settings, token)
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
    server = RemediatorServer(  # binds its port: a taken one fails before any recovery
        engine,
        token,
        registry,
        metrics,
        settings.remediate_bind,
        settings.remediate_port if port is None else port,
        operators=operators,
    )
    engine.recover_interrupted()  # what a stopped remediator left half done
    log.info(
        "remediator configured mode=%s rules=%d actuator=%s state=%s operators=%s",
        mode.value,
        len(policy.rules),
        engine.actuator.name,
        settings.remediate_state_dir,
        ",".join(operators.names()) or "-",
    )
    timer = OutcomeTimer(tracker, policy.outcome.check_every_s).start()
    return Service(server.start(), audit, state, timer)
