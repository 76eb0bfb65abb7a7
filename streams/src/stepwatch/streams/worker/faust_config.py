"""librdkafka-style pass-through settings -> Faust (aiokafka) settings.

Every other stepwatch component speaks librdkafka (confluent-kafka), so users
give Kafka client settings once, as librdkafka keys (``-X key=value`` or
``STEPWATCH_KAFKA__*``). The Faust worker runs on aiokafka; this module maps
what has an aiokafka/Faust equivalent and reports the rest (logged once at
start, listed in docs/streams.md):

=================================  =============================================
librdkafka key                      Faust / aiokafka
=================================  =============================================
security.protocol                   credentials class (SSL, SASL_PLAINTEXT, SASL_SSL)
sasl.mechanism(s)                   PLAIN, SCRAM-SHA-256/512, GSSAPI
sasl.username / sasl.password       SASLCredentials
sasl.kerberos.service.name          GSSAPICredentials.kerberos_service_name
ssl.ca.location                     SSL context cafile (capath if a directory)
ssl.certificate.location,           SSL context client certificate chain
ssl.key.location, ssl.key.password
ssl.endpoint.identification.        ``none``: no host name check
algorithm
enable.ssl.certificate.verification ``false``: no certificate check
client.id                           broker_client_id
group.id                            the Faust app id (= consumer group)
group.instance.id                   consumer_group_instance_id
session.timeout.ms                  broker_session_timeout
heartbeat.interval.ms               broker_heartbeat_interval
max.poll.interval.ms                broker_max_poll_interval
request.timeout.ms                  broker_request_timeout
auto.offset.reset                   consumer_auto_offset_reset
max.partition.fetch.bytes           consumer_max_fetch_size
compression.type                    producer_compression_type
linger.ms                           producer_linger
acks                                producer_acks
message.max.bytes                   producer_max_request_size
=================================  =============================================

OAUTHBEARER needs a token provider object and cannot come from a string: it
is rejected with a ConfigError. Keys not listed are ignored (with a warning).
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from stepwatch.errors import ConfigError

_SECONDS = {
    "session.timeout.ms": "broker_session_timeout",
    "heartbeat.interval.ms": "broker_heartbeat_interval",
    "max.poll.interval.ms": "broker_max_poll_interval",
    "request.timeout.ms": "broker_request_timeout",
    "linger.ms": "producer_linger",
}
_INTS = {
    "max.partition.fetch.bytes": "consumer_max_fetch_size",
    "message.max.bytes": "producer_max_request_size",
}
_STRINGS = {
    "client.id": "broker_client_id",
    "group.instance.id": "consumer_group_instance_id",
    "compression.type": "producer_compression_type",
}
_CREDENTIAL_KEYS = {
    "security.protocol",
    "sasl.mechanism",
    "sasl.mechanisms",
    "sasl.username",
    "sasl.password",
    "sasl.kerberos.service.name",
    "ssl.ca.location",
    "ssl.certificate.location",
    "ssl.key.location",
    "ssl.key.password",
    "ssl.endpoint.identification.algorithm",
    "enable.ssl.certificate.verification",
}
_OFFSET_RESET = {
    "earliest": "earliest",
    "smallest": "earliest",
    "beginning": "earliest",
    "latest": "latest",
    "largest": "latest",
    "end": "latest",
}


@dataclass(frozen=True)
class FaustKafka:
    """What :func:`faust_kafka` derived from the settings."""

    broker: list[str]
    conf: dict[str, Any] = field(default_factory=dict)
    credentials: Any = None
    group_id: str | None = None
    ignored: tuple[str, ...] = ()


def broker_urls(bootstrap_servers: str) -> list[str]:
    servers = [s.strip() for s in bootstrap_servers.split(",") if s.strip()]
    if not servers:
        raise ConfigError("bootstrap_servers is empty: give --bootstrap-servers or --dev-broker")
    return [s if "://" in s else f"kafka://{s}" for s in servers]


def faust_kafka(bootstrap_servers: str, kafka_config: Mapping[str, str]) -> FaustKafka:
    conf: dict[str, Any] = {}
    ignored: list[str] = []
    group_id: str | None = None
    for key, raw in kafka_config.items():
        value = str(raw)
        if key in _SECONDS:
            conf[_SECONDS[key]] = _number(key, value) / 1000.0
        elif key in _INTS:
            conf[_INTS[key]] = int(_number(key, value))
        elif key in _STRINGS:
            conf[_STRINGS[key]] = value
        elif key == "auto.offset.reset":
            if value.lower() not in _OFFSET_RESET:
                raise ConfigError(f"auto.offset.reset: unknown value {value!r}")
            conf["consumer_auto_offset_reset"] = _OFFSET_RESET[value.lower()]
        elif key == "acks":
            conf["producer_acks"] = -1 if value.lower() == "all" else int(_number(key, value))
        elif key == "group.id":
            group_id = value
        elif key not in _CREDENTIAL_KEYS and key != "bootstrap.servers":
            ignored.append(key)
    return FaustKafka(
        broker_urls(bootstrap_servers),
        conf,
        credentials(kafka_config),
        group_id,
        tuple(sorted(ignored)),
    )


def _number(key: str, value: str) -> float:
    try:
        return float(value)
    except ValueError as err:
        raise ConfigError(f"Kafka setting {key}: {value!r} is not a number") from err


def credentials(kafka_config: Mapping[str, str]) -> Any:
    """Faust credentials for ``security.protocol`` and friends (None: plaintext)."""
    import faust

    protocol = str(kafka_config.get("security.protocol", "PLAINTEXT")).upper()
    if protocol == "PLAINTEXT":
        return None
    if protocol not in {"SSL", "SASL_PLAINTEXT", "SASL_SSL"}:
        raise ConfigError(f"security.protocol: unknown value {protocol!r}")
    context = ssl_context(kafka_config) if protocol in {"SSL", "SASL_SSL"} else None
    if protocol == "SSL":
        return faust.SSLCredentials(context)
    mechanism = str(
        kafka_config.get("sasl.mechanism") or kafka_config.get("sasl.mechanisms") or "GSSAPI"
    ).upper()
    if mechanism == "GSSAPI":
        return faust.GSSAPICredentials(
            kerberos_service_name=str(kafka_config.get("sasl.kerberos.service.name", "kafka")),
            ssl_context=context,
        )
    if mechanism in {"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"}:
        return faust.SASLCredentials(
            username=kafka_config.get("sasl.username"),
            password=kafka_config.get("sasl.password"),
            ssl_context=context,
            mechanism=mechanism,
        )
    raise ConfigError(
        f"sasl.mechanism {mechanism} cannot be configured from strings for the "
        "Faust worker (OAUTHBEARER needs a token provider)"
    )


def ssl_context(kafka_config: Mapping[str, str]) -> ssl.SSLContext:
    ca = kafka_config.get("ssl.ca.location")
    try:
        if ca and os.path.isdir(ca):
            context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, capath=ca)
        else:
            context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca or None)
        cert = kafka_config.get("ssl.certificate.location")
        if cert:
            context.load_cert_chain(
                cert,
                kafka_config.get("ssl.key.location") or None,
                kafka_config.get("ssl.key.password") or None,
            )
    except (OSError, ssl.SSLError) as err:
        raise ConfigError(f"cannot build the TLS context for Kafka: {err}") from err
    if str(kafka_config.get("ssl.endpoint.identification.algorithm", "https")).lower() == "none":
        context.check_hostname = False
    if str(kafka_config.get("enable.ssl.certificate.verification", "true")).lower() == "false":
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context
