"""Saved-query registry, parameter binding and output formats."""

from __future__ import annotations

import json

import pytest

from stepwatch.errors import ConfigError
from stepwatch.exporters.clickhouse import queries
from stepwatch.exporters.clickhouse.output import render
from stepwatch.exporters.clickhouse.store import Result
from tests.support import paths

REQUIRED = {
    "lemon_nodes",
    "rank_step_percentiles",
    "goodput_mfu",
    "job_timeline",
    "network_hotspots",
    "gpu_errors",
}
NOW = 1767225600.0  # 2026-01-01T00:00:00Z


def test_every_required_query_is_registered_and_documented():
    registry = queries.registry()
    assert set(registry) >= REQUIRED
    for q in registry.values():
        assert q.summary and q.doc, q.name
        assert q.params, q.name
        for p in q.params:
            assert "{" + f"{p.name}:{p.type}" + "}" in q.sql, (q.name, p.name)
            assert p.help, (q.name, p.name)


def test_docs_describe_every_saved_query():

    doc = (paths.ROOT / "docs" / "queries.md").read_text()
    for name in queries.registry():
        assert f"`{name}`" in doc, name


def test_bind_applies_defaults_and_resolves_times():
    q = queries.get("lemon_nodes")
    params = q.bind({"min_jobs": "3"}, now=NOW)
    assert params["since"] == "2025-12-02 00:00:00.000"  # default -30d
    assert params["min_jobs"] == "3" and params["slow_ratio"] == "1.05"


def test_bind_refuses_missing_unknown_and_malformed_values():
    q = queries.get("rank_step_percentiles")
    with pytest.raises(ConfigError, match="needs --job"):
        q.bind({}, now=NOW)
    with pytest.raises(ConfigError, match="no parameter"):
        q.bind({"job": "j", "colour": "red"}, now=NOW)
    with pytest.raises(ConfigError, match="not an integer"):
        q.bind({"job": "j", "limit": "many"}, now=NOW)
    with pytest.raises(ConfigError, match="as a time"):
        q.bind({"job": "j", "since": "last tuesday"}, now=NOW)
    with pytest.raises(ConfigError, match="no saved query"):
        queries.get("nope")


@pytest.mark.parametrize(
    ("values", "error"),
    [
        ({"min_jobs": "4294967297"}, "outside UInt32"),  # ClickHouse wrapped it to 1
        ({"min_jobs": "-1"}, "outside UInt32"),
        ({"limit": str(2**64)}, "outside UInt32"),
        ({"slow_ratio": "inf"}, "not a finite number"),
        ({"slow_ratio": "nan"}, "not a finite number"),
        ({"since": "1e30"}, "epoch seconds must be"),  # was an OverflowError traceback
        ({"since": "99999999999999"}, "epoch seconds must be"),  # was a ValueError
        ({"since": "nan"}, "epoch seconds must be"),  # was read as all history
    ],
)
def test_bind_refuses_values_out_of_their_types_range(values, error):
    with pytest.raises(ConfigError, match=error):
        queries.get("lemon_nodes").bind(values, now=NOW)


def test_int_range_of_clickhouse_types():
    assert queries.int_range("UInt8") == (0, 255)
    assert queries.int_range("Int16") == (-32768, 32767)
    assert queries.int_range("UInt64") == (0, 2**64 - 1)


def test_the_cli_names_the_mistake_and_describes_with_the_sql(capsys):
    from stepwatch.cli import main

    assert main(["query"]) == 2
    out, err = capsys.readouterr()
    assert "lemon_nodes" in out and "name one of the saved queries" in err
    assert main(["query", "lemon_nodes", "--describe"]) == 0
    out = capsys.readouterr().out
    assert "sql:" in out and "LIMIT {limit:UInt32}" in out


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", 0.0),
        ("30d", NOW - 30 * 86400),
        ("-12h", NOW - 12 * 3600),
        ("15m", NOW - 900),
        ("2w", NOW - 14 * 86400),
        ("2026-01-01", NOW),
        ("2026-01-01T01:00:00Z", NOW + 3600),
        ("2026-01-01T03:00:00+02:00", NOW + 3600),
        ("1767225600.5", NOW + 0.5),
    ],
)
def test_parse_time(text, expected):
    assert queries.parse_time(text, NOW) == pytest.approx(expected, abs=1e-6)


def test_empty_string_default_binds_to_empty():
    q = queries.get("goodput_mfu")
    assert q.bind({}, now=NOW)["job"] == ""


RESULT = Result(
    ("host", "n", "ratio", "jobs"),
    ("String", "UInt64", "Nullable(Float64)", "Array(String)"),
    [("gpu-03", 2, 1.0963, ["a", "b"]), ("gpu-10", 12, None, [])],
)


def test_render_table_aligns_numbers_right():
    text = render(RESULT, "table")
    lines = text.splitlines()
    assert lines[0].split() == ["host", "n", "ratio", "jobs"]
    assert lines[2].startswith("gpu-03   2  1.0963") and "NULL" in lines[3]
    assert lines[-1] == "(2 rows)"


def test_render_csv_and_json():
    assert render(RESULT, "csv").splitlines()[1] == 'gpu-03,2,1.0963,"[""a"",""b""]"'
    data = json.loads(render(RESULT, "json"))
    assert data[1] == {"host": "gpu-10", "n": 12, "ratio": None, "jobs": []}
    assert len(render(RESULT, "jsonl").splitlines()) == 2
    with pytest.raises(ConfigError):
        render(RESULT, "xml")


def test_a_table_shows_stored_control_characters_inert():
    """A table is for a terminal: a stored value (an exception message with colour codes,
    a label an alert sender chose) cannot repaint it; CSV and JSON keep the data."""
    result = Result(("v",), ("String",), [("\x1b[2Jx\u202ey\tz\nw",)])
    assert render(result, "table").splitlines()[2] == "\ufffd[2Jx\ufffdy z w"
    assert json.loads(render(result, "json"))[0]["v"] == "\x1b[2Jx\u202ey\tz\nw"


def test_csv_cells_a_spreadsheet_would_run_are_inert():
    """A host named ``=HYPERLINK(...)`` came out of ``--format csv`` as a live formula."""
    result = Result(
        ("host", "n"),
        ("String", "Int64"),
        [('=HYPERLINK("http://evil.example/","x")', -3), ("@SUM(A1)", 2), ("gpu-01", 1)],
    )
    rows = render(result, "csv").splitlines()[1:]
    assert rows == ['"\'=HYPERLINK(""http://evil.example/"",""x"")",-3', "'@SUM(A1),2", "gpu-01,1"]
    assert json.loads(render(result, "json"))[0]["host"].startswith("=")  # JSON keeps the data
