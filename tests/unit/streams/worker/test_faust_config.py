"""Kafka pass-through for the Faust worker, the CLI frame, the DLQ record format."""

from __future__ import annotations

import ssl

import faust
import pytest

from stepwatch.cli import main
from stepwatch.errors import ConfigError
from stepwatch.streams.worker.dlq import (
    MAX_PAYLOAD_BYTES,
    DlqReason,
    dead_letter,
    decode_dead_letter,
    encode_dead_letter,
    original_payload,
)
from stepwatch.streams.worker.faust_config import broker_urls, faust_kafka


def test_librdkafka_keys_map_to_faust_settings() -> None:
    fk = faust_kafka(
        "k1:9092, k2:9093",
        {
            "client.id": "sw",
            "session.timeout.ms": "6000",
            "heartbeat.interval.ms": "1000",
            "auto.offset.reset": "largest",
            "acks": "all",
            "linger.ms": "5",
            "group.id": "grp",
            "compression.type": "lz4",
            "statistics.interval.ms": "1000",
            "enable.idempotence": "true",
        },
    )
    assert fk.broker == ["kafka://k1:9092", "kafka://k2:9093"]
    assert fk.conf == {
        "broker_client_id": "sw",
        "broker_session_timeout": 6.0,
        "broker_heartbeat_interval": 1.0,
        "consumer_auto_offset_reset": "latest",
        "producer_acks": -1,
        "producer_linger": 0.005,
        "producer_compression_type": "lz4",
    }
    assert fk.group_id == "grp"
    assert fk.ignored == ("enable.idempotence", "statistics.interval.ms")
    assert fk.credentials is None


def test_sasl_scram_over_tls() -> None:
    fk = faust_kafka(
        "k:9092",
        {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "u",
            "sasl.password": "p",
            "ssl.endpoint.identification.algorithm": "none",
        },
    )
    cred = fk.credentials
    assert isinstance(cred, faust.SASLCredentials)
    assert (cred.username, cred.password, cred.mechanism.value) == ("u", "p", "SCRAM-SHA-512")
    assert cred.protocol.value == "SASL_SSL"
    assert isinstance(cred.ssl_context, ssl.SSLContext) and not cred.ssl_context.check_hostname


def test_plain_tls_gssapi_and_errors() -> None:
    tls = faust_kafka(
        "k:1", {"security.protocol": "ssl", "enable.ssl.certificate.verification": "false"}
    ).credentials
    assert isinstance(tls, faust.SSLCredentials)
    assert tls.context.verify_mode == ssl.CERT_NONE
    gss = faust_kafka(
        "k:1", {"security.protocol": "SASL_PLAINTEXT", "sasl.kerberos.service.name": "kfk"}
    ).credentials
    assert isinstance(gss, faust.GSSAPICredentials) and gss.kerberos_service_name == "kfk"
    with pytest.raises(ConfigError, match="OAUTHBEARER"):
        faust_kafka("k:1", {"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER"})
    with pytest.raises(ConfigError, match=r"security\.protocol"):
        faust_kafka("k:1", {"security.protocol": "SMOKE_SIGNALS"})
    with pytest.raises(ConfigError, match="not a number"):
        faust_kafka("k:1", {"session.timeout.ms": "soon"})
    with pytest.raises(ConfigError, match="TLS context"):
        faust_kafka("k:1", {"security.protocol": "SSL", "ssl.ca.location": "/nonexistent/ca.pem"})
    with pytest.raises(ConfigError, match="bootstrap"):
        broker_urls(" , ")


def test_stream_help_explains(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["stream", "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    for needle in (
        "--dev-broker",
        "--metrics-port",
        "consumer group",
        "SIGTERM",
        "security.protocol",
        "<prefix>.dlq",
    ):
        assert needle in text


def test_stream_without_bootstrap_servers_is_an_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("STEPWATCH_BOOTSTRAP_SERVERS", raising=False)
    assert main(["stream"]) == 1
    assert "--dev-broker" in capsys.readouterr().err


def test_dead_letter_keeps_the_payload_and_truncates_huge_ones() -> None:
    big = b"x" * (MAX_PAYLOAD_BYTES + 10)
    letter = dead_letter(
        DlqReason.SCHEMA,
        "d" * 5000,
        topic="t.steps",
        partition=3,
        offset=9,
        key=None,
        payload=big,
        worker="w",
        now=1.0,
    )
    back = decode_dead_letter(encode_dead_letter(letter))
    assert back.payload_truncated and back.payload_bytes == len(big)
    assert original_payload(back) == big[:MAX_PAYLOAD_BYTES]
    assert len(back.detail) == 1000 and back.key is None and back.ts == 1.0
    binary = dead_letter(
        DlqReason.MALFORMED_JSON,
        "x",
        topic="t",
        partition=0,
        offset=0,
        key=b"\xff",
        payload=b"\x00\xff",
    )
    assert binary.payload_encoding == "base64" and original_payload(binary) == b"\x00\xff"
