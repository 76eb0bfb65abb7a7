"""The server backend's client arguments, error mapping and wire formats."""

from __future__ import annotations

import pytest

from stepwatch.errors import ConfigError
from stepwatch.exporters.clickhouse.connect_backend import _safe, client_args
from stepwatch.exporters.clickhouse.store import (
    ClickHouseError,
    dedup_settings,
    encode_rows,
    error_from,
    parse_json_compact,
    strip_sql,
)


def test_https_url_means_tls_on_8443_with_settings_credentials():
    args = client_args("https://ch.example.com", "ingest", "s3cret")
    assert args["secure"] is True and args["interface"] == "https" and args["port"] == 8443
    assert args["host"] == "ch.example.com"
    assert (args["username"], args["password"]) == ("ingest", "s3cret")
    assert args["autogenerate_session_id"] is False and args["query_retries"] == 0


def test_http_url_with_credentials_port_path_and_tls_options():
    args = client_args(
        "http://bob:p%40ss@10.0.0.5:18123/proxy/ch/?verify=false&ca_cert=/etc/ca.pem"
    )
    assert args["secure"] is False and args["port"] == 18123
    assert (args["username"], args["password"]) == ("bob", "p@ss")
    assert args["proxy_path"] == "/proxy/ch"
    assert args["verify"] is False and args["ca_cert"] == "/etc/ca.pem"
    assert client_args("http://h")["username"] == "default"


@pytest.mark.parametrize("url", ["ch.example.com:8123", "tcp://h:9000", "https://"])
def test_bad_urls_are_config_errors(url):
    with pytest.raises(ConfigError):
        client_args(url)


def test_messages_never_show_credentials():
    assert _safe("https://bob:secret@h:8443/p") == "https://h:8443/p"


def test_error_codes_decide_between_bisect_and_retry():
    parse = error_from(RuntimeError("Code: 27. DB::Exception: Cannot parse input"), "insert")
    assert parse.code == 27 and parse.data_error and not parse.retryable
    down = error_from(RuntimeError("Code: 210. DB::Exception: Connection refused"), "insert")
    assert down.code == 210 and down.retryable
    schema = error_from(RuntimeError("Code: 60. DB::Exception: Unknown table"), "insert")
    assert schema.retryable  # a schema problem stalls loudly; it must not dead-letter every row
    assert ClickHouseError("no code").retryable
    # 252 is two errors: the block's data (bisect) or the server's merges behind (retry)
    months = error_from(
        RuntimeError(
            "Code: 252. DB::Exception: Too many partitions for single INSERT block "
            "(more than 100). The limit is controlled by 'max_partitions_per_insert_block'"
        ),
        "insert",
    )
    assert months.code == 252 and months.data_error
    parts = error_from(
        RuntimeError(
            "Code: 252. DB::Exception: Too many parts (3001 with average size of 1.2 MiB) in "
            "table 'stepwatch.steps'. Merges are processing significantly slower than "
            "inserts. (TOO_MANY_PARTS)"
        ),
        "insert",
    )
    assert parts.code == 252 and parts.retryable


def test_rows_go_as_json_compact_each_row_and_results_parse_back():
    assert encode_rows([(1, "a", None), (2, "b\n", [1.5])]) == b'[1,"a",null]\n[2,"b\\n",[1.5]]'
    body = (
        b'{"meta":[{"name":"n","type":"UInt64"},{"name":"s","type":"String"}],'
        b'"data":[[1,"x"]],"rows":1}'
    )
    result = parse_json_compact(body)
    assert result.columns == ("n", "s") and result.rows == [(1, "x")] and result.scalar() == 1
    assert parse_json_compact(b"").rows == []
    assert strip_sql(" SELECT 1; \n") == "SELECT 1"
    assert dedup_settings("tok") == {"insert_deduplicate": 1, "insert_deduplication_token": "tok"}
    assert dedup_settings(None) == {}
