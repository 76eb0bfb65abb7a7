"""``stepwatch simulate``: fault specs, files, determinism, pacing, the Kafka path (faked)."""

from __future__ import annotations

import argparse
import json
import pathlib
import time
from collections.abc import Sequence

import pytest

from stepwatch.cli import main
from stepwatch.cli import simulate as cli
from stepwatch.contract import Message, StepMessage, read_jsonl
from stepwatch.errors import ConfigError, ContractError
from stepwatch.sim import Fault, FaultKind, Scenario, parse_fault, read_labels, simulate
from stepwatch.sim.pacing import batches, paced


def test_parse_fault_reads_every_key() -> None:
    spec = parse_fault("slow_gpu:rank=5:start=100:severity=0.1")
    assert spec.fault == Fault(FaultKind.SLOW_GPU, rank=5, start_step=100, severity=0.1)
    spec = parse_fault("LINK-FLAP:host=node0001:nic=3:start=7:end=9:duration=2.5:job=1")
    assert spec.job == "1"
    assert spec.fault == Fault(
        FaultKind.LINK_FLAP, host="node0001", nic=3, start_step=7, end_step=9, duration_seconds=2.5
    )


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("slow_cpu:rank=1", "unknown fault kind"),
        ("slow_gpu:rank", "expected key=value"),
        ("slow_gpu:rank=x", "bad value for rank"),
        ("slow_gpu:colour=red", "unknown key"),
        ("slow_gpu:start=10:end=5", "end_step must be > start_step"),
        ("slow_gpu:severity=-1", "severity"),
    ],
)
def test_parse_fault_rejects_bad_specs(text: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        parse_fault(text)


def run_cli(
    tmp_path: pathlib.Path, *extra: str, name: str = "a"
) -> tuple[bytes, list[dict[str, object]]]:
    out, labels = tmp_path / f"{name}.jsonl", tmp_path / f"{name}.json"
    code = main(
        [
            "simulate",
            "--nodes",
            "2",
            "--steps",
            "40",
            "--out",
            str(out),
            "--labels",
            str(labels),
            "--fault",
            "slow_gpu:rank=5:start=10:severity=0.1",
            *extra,
        ]
    )
    assert code == 0
    return out.read_bytes(), json.loads(labels.read_text())


def test_cli_writes_messages_and_labels_and_is_deterministic(tmp_path: pathlib.Path) -> None:
    first, labels = run_cli(tmp_path, name="a")
    second, _ = run_cli(tmp_path, name="b")
    assert first == second  # same seed, identical bytes
    third, _ = run_cli(tmp_path, "--seed", "2", name="c")
    assert third != first
    decoded = list(read_jsonl(first.splitlines()))
    assert decoded and not any(isinstance(m, ContractError) for m in decoded)
    assert any(isinstance(m, StepMessage) for m in decoded)
    assert labels == [read_labels(tmp_path / "a.json")[0].to_dict()]
    assert labels[0]["rank"] == 5 and labels[0]["detection"] == "straggler"


def test_cli_runs_several_jobs_and_routes_faults_to_them(tmp_path: pathlib.Path) -> None:
    data, labels = run_cli(
        tmp_path,
        "--jobs",
        "2",
        "--fault",
        "job_hang:start=20:job=job-1-2",
        "--no-gpu",
        "--no-ports",
    )
    jobs = {label["job_id"]: label["kind"] for label in labels}
    assert jobs == {"job-1-1": "slow_gpu", "job-1-2": "job_hang"}
    hosts = {m.host for m in read_jsonl(data.splitlines()) if not isinstance(m, ContractError)}
    assert hosts == {"node0000", "node0001", "node0002", "node0003"}
    with pytest.raises(ConfigError, match="no such job"):
        cli.build_scenarios(cli_args("--fault", "job_hang:job=7"))


def cli_args(*argv: str) -> argparse.Namespace:
    from stepwatch.cli import build_parser

    return build_parser().parse_args(["simulate", *argv])


def test_cli_stdout_and_stats(capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    assert main(["simulate", "--nodes", "1", "--steps", "5", "--out", "-", "--stats"]) == 0
    captured = capsysbinary.readouterr()
    lines = captured.out.splitlines()
    assert lines and json.loads(lines[0])["type"] == "job_start"
    assert b"step_records=40" in captured.err


def test_paced_releases_messages_at_their_time() -> None:
    sc = Scenario(
        nodes=1,
        steps=3,
        step_seconds=0.1,
        init_seconds=0.1,
        tick_seconds=0.1,
        end_tail_seconds=0.1,
        with_ports=False,
    )
    messages = list(simulate(sc))
    span = messages[-1].ts - messages[0].ts
    started = time.monotonic()
    released = []
    for m in paced(messages, speed=4.0, start=messages[0].ts):
        released.append((time.monotonic() - started, m.ts - messages[0].ts))
    assert released[-1][0] >= span / 4.0 - 0.02
    assert all(wall >= (ts / 4.0) - 0.02 for wall, ts in released)


def test_batches_are_one_tick_wide_and_bounded() -> None:
    sc = Scenario(nodes=2, steps=5, with_ports=False)
    messages = list(simulate(sc))
    groups = list(batches(messages, width=0.25, max_size=3))
    assert [m for g in groups for m in g] == messages  # nothing lost, order kept
    assert all(len(g) <= 3 and g[-1].ts - g[0].ts < 0.25 for g in groups)


class FakeSink:
    def __init__(self) -> None:
        self.batches: list[list[Message]] = []
        self.closed = False

    def send(self, messages: Sequence[Message]) -> None:
        self.batches.append(list(messages))

    def flush(self, timeout: float = 10.0) -> int:
        return 0

    def close(self, timeout: float = 10.0) -> None:
        self.closed = True


def test_kafka_path_sends_everything_in_batches_through_a_message_sink(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    sink = FakeSink()
    seen: list[object] = []

    def fake(settings: object) -> FakeSink:
        seen.append(settings)
        return sink

    monkeypatch.setattr(cli, "_kafka_sink", fake)
    tee = tmp_path / "tee.jsonl"
    code = main(
        [
            "simulate",
            "--nodes",
            "2",
            "--steps",
            "30",
            "--bootstrap-servers",
            "127.0.0.1:1",
            "--topic-prefix",
            "sim",
            "--out",
            str(tee),
        ]
    )
    assert code == 0 and sink.closed
    sent = [m for batch in sink.batches for m in batch]
    assert (
        len(sent)
        == len(tee.read_bytes().splitlines())
        == len(list(simulate(Scenario(nodes=2, steps=30))))
    )
    assert max(len(b) for b in sink.batches) <= 2000
    settings = seen[0]
    assert settings.bootstrap_servers == "127.0.0.1:1" and settings.topic_prefix == "sim"  # type: ignore[attr-defined]
    assert "stepwatch-sim-spool-" in settings.spool_dir  # type: ignore[attr-defined]


def test_kafka_without_a_broker_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STEPWATCH_BOOTSTRAP_SERVERS", raising=False)
    assert main(["simulate", "--nodes", "1", "--steps", "3", "--kafka"]) == 1


def test_out_file_prints_one_summary_line(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "events.jsonl"
    assert (
        main(
            [
                "simulate",
                "--nodes",
                "2",
                "--steps",
                "20",
                "--jobs",
                "2",
                "--step-seconds",
                "1",
                "--out",
                str(path),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    messages = [
        m for m in read_jsonl(path.read_bytes().splitlines()) if not isinstance(m, Exception)
    ]
    assert messages
    span = max(m.ts for m in messages) - min(m.ts for m in messages)
    assert out.count("\n") == 1
    assert out.startswith(f"wrote {path}: {len(messages)} messages, 2 job(s), 32 ranks, ")
    assert f" {span:.0f} s of event time, " in out
    size = path.stat().st_size
    assert out.rstrip().endswith(
        f"{size / 1024:.1f} KiB" if size < 1024**2 else f"{size / 1024**2:.1f} MiB"
    )


def test_out_stdout_has_no_summary(capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    assert main(["simulate", "--nodes", "1", "--steps", "3", "--out", "-"]) == 0
    lines = capsysbinary.readouterr().out.splitlines()
    assert lines and all(line.startswith(b"{") for line in lines)
