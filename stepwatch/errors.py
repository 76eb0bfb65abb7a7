"""One exception root for everything stepwatch raises.

Third-party errors are re-raised as one of these with ``raise ... from err`` so
callers need to catch only :class:`StepwatchError`.
"""

from __future__ import annotations


class StepwatchError(Exception):
    """Root of every error stepwatch raises."""


class ConfigError(StepwatchError):
    """A setting is missing, malformed or out of range."""


class ContractError(StepwatchError):
    """A message does not satisfy the event contract.

    ``reason`` is a short machine-friendly code (``malformed_json``,
    ``schema``, ``unknown_kind``, ``unsupported_version``, ``absurd_value``);
    the message says precisely what is wrong.
    """

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class TransportError(StepwatchError):
    """Kafka (or another transport) failed in a way the caller must know about."""


class BrokerError(StepwatchError):
    """The development broker could not be started or stopped."""


class CollectorError(StepwatchError):
    """A collector could not read its source (NVML, sysfs, an exporter endpoint)."""


class SpoolError(StepwatchError):
    """The on-disk spool is unusable (unwritable directory, corrupt segment)."""


class StoreError(StepwatchError):
    """The historical store (ClickHouse / chdb) rejected a query or insert."""


class StoreLockedError(StoreError):
    """Another process owns the embedded store's path (chdb allows one owner)."""


class MissingDependencyError(StepwatchError):
    """An optional dependency is not installed; the message names the extra to install."""


class DetectionError(StepwatchError):
    """The detection core was given input it cannot work with."""


class DaemonError(StepwatchError):
    """A launched daemon (Prometheus, Alertmanager, Slurm) failed to start, answer or stop."""


class RemediationError(StepwatchError):
    """The remediator could not parse an alert, load its policy or keep its state."""


class ActuatorError(RemediationError):
    """An actuator (Slurm, Kubernetes, a command, a webhook) failed.

    ``transient`` says whether the same call may succeed later (a timeout, a
    busy controller) or never will (unknown node, permission denied).
    """

    def __init__(self, message: str, *, transient: bool) -> None:
        super().__init__(message)
        self.transient = transient
