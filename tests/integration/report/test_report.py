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


def test_report_through_the_owners_endpoint_is_the_direct_one(store_path, tmp_path) -> None:
    """While a sink or ``db serve`` owns the store, the report reads through its endpoint
    with clickhouse-connect: list parameters (hosts, run starts) must bind there as they
    do in the engine (a ready-made ``"['a']"`` string was escaped into a String there,
    and the report failed whenever an owner ran)."""
    from stepwatch.cli import main
    from stepwatch.exporters.clickhouse.chdb_backend import ChdbStore
    from stepwatch.exporters.clickhouse.service import QueryService, endpoint_path

    direct = tmp_path / "direct"
    args = ["report", "--job", sim_store.JOB, "--store-path", str(store_path), "--out"]
    assert main([*args, str(direct)]) == 0
    store = ChdbStore(str(store_path))
    service = QueryService(str(store_path), endpoint_file=endpoint_path(str(store_path))).start()
    try:
        served = tmp_path / "served"
        assert main([*args, str(served)]) == 0
    finally:
        service.stop()
        store.close()
    name = f"report-{sim_store.JOB}.html"
    assert (served / name).read_text() == (direct / name).read_text()
    assert sorted(p.name for p in served.glob("*.png")) == sorted(
        p.name for p in direct.glob("*.png")
    )
