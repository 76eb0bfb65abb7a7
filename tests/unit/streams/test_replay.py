"""Offline replay end to end: a small JSON Lines file through `stepwatch replay`."""

from __future__ import annotations

import gzip
import io
import json
import sys
from pathlib import Path

import msgspec
import pytest

from stepwatch.cli import main
from stepwatch.contract import DetectionMessage, EventType, Message, encode
from stepwatch.streams.core import Engine
from stepwatch.streams.replay import replay
from tests.support.detect_synth import T0, Job, event, gpu_message, interleave


def _write(path: Path, extra_lines: dict[int, bytes]) -> int:
    job = Job(world=16, steps=60, slow={5: (20, 1.2)})
    samples: list[Message] = [gpu_message(h, T0 + k) for k in range(62) for h in job.hosts()]
    messages = job.messages()
    end_ts = messages[-1].ts + 0.5
    samples.append(
        event(EventType.JOB_END, "h000", end_ts, job_id=job.job_id, code=0, detail="completed")
    )
    lines = [encode(m) for m in interleave(messages, samples)]
    for at, bad in sorted(extra_lines.items()):
        lines.insert(at - 1, bad)
    data = b"\n".join(lines) + b"\n"
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return len(lines)


BAD = {
    3: b'{"kind": "step", "v": 1, "host": "h000", "ts": 17672',
    10: b"not json at all",
    20: b'{"kind": "gpu", "v": 7, "host": "h000", "ts": 1767225610.0}',
    30: b'{"kind": "step", "v": 1, "host": "h000", "ts": -5.0}',
}


@pytest.mark.parametrize("name", ["events.jsonl", "events.jsonl.gz"])
def test_replay_cli_writes_detections_and_reports_bad_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    events = tmp_path / name
    _write(events, BAD)
    out, dlq = tmp_path / "detections.jsonl", tmp_path / "dlq.jsonl"
    rc = main(["replay", str(events), "--out", str(out), "--dlq", str(dlq)])
    assert rc == 0
    found = [
        msgspec.json.decode(line, type=DetectionMessage) for line in out.read_bytes().splitlines()
    ]
    assert [(d.type, d.state, d.rank) for d in found] == [
        ("straggler", "open", 5),
        ("straggler", "resolved", 5),
    ]
    assert found[0].id == found[1].id
    bad = [json.loads(line) for line in dlq.read_text().splitlines()]
    assert [(b["line"], b["reason"]) for b in bad] == [
        (3, "malformed_json"),
        (10, "malformed_json"),
        (20, "unsupported_version"),
        (30, "absurd_value"),
    ]
    assert bad[1]["payload"] == "not json at all"
    captured = capsys.readouterr()
    assert f"{name}:10: malformed_json" in captured.err
    assert "malformed lines: 4" in captured.out
    assert "detections: straggler/open 1, straggler/resolved 1" in captured.out


def test_replay_to_stdout_keeps_the_summary_on_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events = tmp_path / "e.jsonl"
    _write(events, {})
    assert main(["replay", str(events), "--quiet"]) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert len(lines) == 2 and all(json.loads(x)["kind"] == "detection" for x in lines)
    assert "replayed" in captured.err


def test_replay_function_ticks_on_event_time(tmp_path: Path) -> None:
    events = tmp_path / "e.jsonl"
    _write(events, {})
    found: list[DetectionMessage] = []
    errors: list[int] = []
    summary = replay(
        events.read_bytes().splitlines(),
        Engine(),
        found.append,
        lambda n, err, raw: errors.append(n),
    )
    assert errors == [] and summary.malformed == 0
    assert summary.kinds["step"] == 120 and summary.kinds["gpu"] == 124
    assert summary.kinds["event"] == 1
    assert summary.jobs[0].last_step == 59
    assert [d.state for d in found] == ["open", "resolved"]


def test_missing_input_file_is_a_clear_error(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["replay", str(tmp_path / "nope.jsonl")]) == 1
    assert "cannot read" in capsys.readouterr().err


def test_replay_exits_non_zero_when_every_line_is_malformed(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    events = tmp_path / "garbage.jsonl"
    events.write_text('not json\n{"kind": "nope"}\n{"kind":"step"}\n')
    assert main(["replay", str(events), "--quiet"]) == 1
    assert "all 3 lines" in capsys.readouterr().err
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert main(["replay", str(empty), "--quiet"]) == 0


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_replay_progress_only_on_a_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    events, out = tmp_path / "e.jsonl", tmp_path / "d.jsonl"
    _write(events, {})
    # not a terminal: stderr is exactly what it was, no spinner and no escape codes
    assert main(["replay", str(events), "--quiet", "--out", "-"]) == 0
    plain = capsys.readouterr()
    assert plain.err.startswith("replayed ") and "\x1b" not in plain.err
    assert "replaying" not in plain.err
    # a terminal: the spinner draws there, stdout (to a file here) stays clean
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(["replay", str(events), "--quiet", "--out", str(out)]) == 0
    monkeypatch.undo()
    captured = capsys.readouterr()
    assert "replaying e.jsonl: 245 lines" in terminal.getvalue()
    assert captured.out.startswith("replayed ") and "\x1b" not in captured.out
    detections = out.read_text().splitlines()
    assert len(detections) == 2 and plain.out.splitlines() == detections


def test_a_silence_is_ticked_through_before_the_message_that_ends_it() -> None:
    """A job hung at step 29 (every rank stopped together), killed as a whole 2 minutes
    later: the replay reports the hang a live worker reports at its limit (60 s), no
    rank. Before, the silence was judged only after the first ``rank_exit`` was read,
    and the rank killed first with the rest was named ``rank_missing`` (exited first)."""
    job = Job(world=8, per_host=4, steps=30)
    messages: list[Message] = list(job.messages())
    stop = max(r.end for m in job.messages() for r in m.steps)
    for rank in range(8):  # h000's agent reads its ranks' exits 20 ms before h001's
        host = job.host(rank)
        kill = stop + 120.0 + (0.02 if host == "h001" else 0.0)
        attrs = {"last_step": 29, "pid": 100 + rank, "signal": 9}
        messages.append(
            event(EventType.RANK_EXIT, host, kill, job_id=job.job_id, rank=rank, attrs=attrs)
        )
    found: list[DetectionMessage] = []
    replay((encode(m) for m in messages), Engine(), found.append, lambda *a: None)
    opened = [(d.type, d.rank) for d in found if d.state == "open"]
    assert opened == [("hang", None)]
    hang = next(d for d in found if d.state == "open")
    assert 60 <= float(hang.evidence["silent_s"]) < 62  # type: ignore[arg-type]
