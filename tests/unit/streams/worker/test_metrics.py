"""stepwatch_detection_score: one series per open detection, with what alerts route on."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from stepwatch.contract import DetectionMessage
from stepwatch.streams.worker.metrics import JobCollector, Snapshot


def text_of(*opened: DetectionMessage) -> str:
    collector = JobCollector()
    collector.snapshot = Snapshot(open=opened)
    reg = CollectorRegistry(auto_describe=False)
    reg.register(collector)
    return generate_latest(reg).decode()


def det(**kw) -> DetectionMessage:
    base = {"host": "stepwatch", "ts": 1.0, "id": "d", "job_id": "j1", "state": "open"}
    return DetectionMessage(**{**base, **kw})


def test_straggler_carries_rank_host_gpu_cause_and_fault() -> None:
    text = text_of(
        det(type="straggler", rank=5, gpu=5, host="node02", cause="gpu", fault="system", score=0.21)
    )
    assert (
        'stepwatch_detection_score{cause="gpu",device="",fault="system",gpu="5",group="",'
        'host="node02",job_id="j1",port="",rank="5",type="straggler"} 0.21'
    ) in text


def test_network_slowdown_is_localized_to_the_suspect_host_and_port() -> None:
    text = text_of(
        det(
            type="job_slowdown",
            cause="network",
            fault="system",
            score=0.3,
            evidence={"suspect_host": "node03", "device": "mlx5_2", "port": 1},
        )
    )
    assert (
        '{cause="network",device="mlx5_2",fault="system",gpu="",group="",host="node03",'
        'job_id="j1",port="1",rank="",type="job_slowdown"} 0.3'
    ) in text


def test_detections_without_score_read_one_and_series_go_when_resolved() -> None:
    text = text_of(det(type="user_error", rank=2, cause="user", fault="user"))
    assert 'type="user_error"} 1.0' in text
    assert "stepwatch_detection_score{" not in text_of()
