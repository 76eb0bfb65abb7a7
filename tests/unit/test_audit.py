from __future__ import annotations

from stepwatch.audit import SeqAudit
from stepwatch.contract import GpuMessage, StepMessage


def _gpu(host: str, seq: int, inst: str = "a") -> GpuMessage:
    return GpuMessage(host=host, ts=1.0, inst=inst, seq=seq)


def test_clean_stream() -> None:
    audit = SeqAudit()
    for seq in range(5):
        audit.add(_gpu("n1", seq))
        audit.add(StepMessage(host="n1", ts=1.0, inst="a", seq=seq, job_id="j"))
    report = audit.report()
    assert report.clean and report.messages == 10 and report.streams == 2
    assert report.by_kind == {"gpu": 5, "step": 5}


def test_gap_duplicate_and_reorder_are_counted() -> None:
    audit = SeqAudit()
    for seq in (0, 1, 3, 3, 2, 6):
        audit.add(_gpu("n1", seq))
    report = audit.report()
    assert report.missing == 2  # 4 and 5
    assert report.duplicates == 1
    assert report.out_of_order == 1  # 2 after 3
    assert not report.clean


def test_new_instance_is_a_new_stream() -> None:
    audit = SeqAudit()
    audit.add(_gpu("n1", 0, inst="a"))
    audit.add(_gpu("n1", 0, inst="b"))
    assert audit.report().clean and audit.report().streams == 2
