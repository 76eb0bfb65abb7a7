"""``stepwatch simulate`` publishes to the broker named by STEPWATCH_BOOTSTRAP_SERVERS
(as the compose simulator is configured), and writes a file when --out names one."""

from __future__ import annotations

import pathlib

import pytest

import stepwatch.cli.simulate as cli
from stepwatch.cli import main

pytestmark = pytest.mark.unit


class FakeSink:
    def __init__(self) -> None:
        self.sent = 0

    def send(self, batch: list) -> None:
        self.sent += len(batch)

    def flush(self, timeout: float) -> int:
        return 0

    def close(self, timeout: float = 10.0) -> None:
        pass


def test_env_bootstrap_servers_sends_to_kafka(
    monkeypatch: pytest.MonkeyPatch, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    sink = FakeSink()
    seen: list = []
    monkeypatch.setenv("STEPWATCH_BOOTSTRAP_SERVERS", "kafka:9092")
    monkeypatch.setattr(cli, "_kafka_sink", lambda s: seen.append(s) or sink)
    assert main(["simulate", "--nodes", "1", "--steps", "5"]) == 0
    assert sink.sent > 0 and seen[0].bootstrap_servers == "kafka:9092"
    assert capsysbinary.readouterr().out == b""  # nothing on stdout


def test_env_bootstrap_with_out_file_writes_the_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    monkeypatch.setenv("STEPWATCH_BOOTSTRAP_SERVERS", "kafka:9092")
    monkeypatch.setattr(cli, "_kafka_sink", lambda s: pytest.fail("must not publish"))
    out = tmp_path / "e.jsonl"
    assert main(["simulate", "--nodes", "1", "--steps", "5", "--out", str(out)]) == 0
    assert out.read_bytes().count(b"\n") > 0
