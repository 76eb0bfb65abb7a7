"""``stepwatch report`` over a simulated run loaded into the embedded store."""

from __future__ import annotations

import base64
import re

import pytest

from tests.support import sim_store

pytest.importorskip("matplotlib")
pytestmark = pytest.mark.integration

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("report") / "chdb"
    sim_store.fill(path)
    return path


def test_report_html_is_self_contained_with_every_section(store_path, tmp_path, capsys) -> None:
    from stepwatch.cli import main

    out = tmp_path / "out"
    assert (
        main(["report", "--job", sim_store.JOB, "--store-path", str(store_path), "--out", str(out)])
        == 0
    )
    html_path = out / f"report-{sim_store.JOB}.html"
    captured = capsys.readouterr()
    assert captured.out.strip() == str(html_path)
    assert "opening the store" not in captured.err  # no status line off a terminal
    html = html_path.read_text()
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html)
    pngs = sorted(out.glob("*.png"))
    # heat map, step time, goodput, timeline + GPU and NIC of both flagged hosts
    assert len(images) == len(pngs) == 8
    assert all(base64.b64decode(i).startswith(PNG) for i in images)
    assert all(p.read_bytes().startswith(PNG) for p in pngs)
    assert 'src="http' not in html and "<script" not in html  # nothing fetched from elsewhere
    for section in (
        "Goodput and badput",
        "Detections",
        "Cause evidence",
        "Alerts",
        "Remediation actions",
        "GPU signals: node0001",
        "NIC signals: node0003",
    ):
        assert section in html
    # the GPU straggler is reported with its host, rank and cause; no alerts/actions stored
    assert re.search(r"straggler [^<]*: host node0001 rank 13, cause gpu", html)
    assert html.count('<p class="none">none</p>') == 2


def test_report_for_an_unknown_job_fails_clearly(store_path, tmp_path, capsys) -> None:
    from stepwatch.cli import main

    code = main(
        ["report", "--job", "no-such-job", "--store-path", str(store_path), "--out", str(tmp_path)]
    )
    assert code != 0
    assert "no steps of job 'no-such-job'" in capsys.readouterr().err
