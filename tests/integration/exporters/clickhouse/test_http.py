"""clickhouse-connect, the production client, end to end over HTTP.

No ClickHouse server installs here, so the server is the owner's query
endpoint (stepwatch.exporters.clickhouse.service): ClickHouse's HTTP interface in front
of the real engine (chdb). The client, its HTTP requests, server-side
parameter binding, compressed inserts and error parsing are all the real ones.
"""

from __future__ import annotations

import json
import os
import urllib.request

import pytest

from stepwatch.errors import StoreError
from stepwatch.exporters.clickhouse import rows as R
from stepwatch.exporters.clickhouse.access import open_reader, open_writer
from stepwatch.exporters.clickhouse.chdb_backend import ChdbStore
from stepwatch.exporters.clickhouse.connect_backend import ClickHouseConnectStore
from stepwatch.exporters.clickhouse.migrations import Migrator, load_migrations
from stepwatch.exporters.clickhouse.service import USER, Endpoint, QueryService, endpoint_path
from stepwatch.exporters.clickhouse.store import ClickHouseError
from stepwatch.settings import Settings

EVENT_COLS = ("ts", "job_id", "host", "type", "detail", "attrs", "inst", "seq")


@pytest.fixture()
def owner(tmp_path):
    """This process owns an embedded store and serves it read-write and read-only."""
    path = str(tmp_path / "chdb")
    store = ChdbStore(path)
    rw = QueryService(path, allow_writes=True).start()
    ro = QueryService(path, endpoint_file=endpoint_path(path)).start()
    yield store, rw, ro
    ro.stop()
    rw.stop()
    store.close()


def connect(service: QueryService, **kw) -> ClickHouseConnectStore:
    return ClickHouseConnectStore(service.url, USER, service.password, "stepwatch", **kw)


def test_migrations_inserts_dedup_and_parameters_through_the_real_client(owner):
    _, rw, _ = owner
    client = connect(rw)
    try:
        assert [m.version for m in Migrator(client, raw_ttl_days=20000).migrate()] == [
            m.version for m in load_migrations()
        ]
        assert Migrator(client, raw_ttl_days=20000).migrate() == []
        row = (1767225600.25, "job'1", "h", "xid", "Xid 79", {"pci": "0000:9A"}, "i", 7)
        for _ in range(2):
            client.insert("events", EVENT_COLS, [row], token="g|t.events|0|7-7|events")
        client.insert("events", EVENT_COLS, [(*row[:-1], 8)], token="g|t.events|0|8-8|events")
        result = client.query(
            "SELECT seq, attrs, toString(ts) AS t FROM events "
            "WHERE job_id = {j:String} ORDER BY seq",
            {"j": "job'1"},
        )
        assert result.rows == [
            (7, {"pci": "0000:9A"}, "2026-01-01 00:00:00.250"),
            (8, {"pci": "0000:9A"}, "2026-01-01 00:00:00.250"),
        ]
        with pytest.raises(ClickHouseError) as err:
            client.query("SELECT * FROM no_such_table")
        assert err.value.code == 60
        with pytest.raises(ClickHouseError) as err:
            client.insert("events", ("seq",), [("not a number",)], token="x")
        assert err.value.data_error
    finally:
        client.close()


def test_the_read_only_endpoint_refuses_writes_and_strangers(owner):
    _, rw, ro = owner
    setup = connect(rw)
    Migrator(setup, raw_ttl_days=20000).migrate()
    setup.close()
    reader = connect(ro, create_database=False)
    try:
        assert reader.query("SELECT count() FROM schema_migrations").scalar() == len(
            load_migrations()
        )
        with pytest.raises(ClickHouseError, match="readonly"):
            reader.command("DROP TABLE events")
        with pytest.raises(ClickHouseError, match="readonly"):
            reader.insert("events", EVENT_COLS, [(1767225600.0, "j", "h", "xid", "", {}, "i", 1)])
    finally:
        reader.close()
    with pytest.raises(StoreError, match="Authentication failed"):
        ClickHouseConnectStore(ro.url, USER, "wrong", "stepwatch", create_database=False)
    with urllib.request.urlopen(ro.url + "/ping", timeout=5) as reply:
        assert reply.read() == b"Ok.\n"


def test_readers_find_the_owner_and_writers_refuse_to_compete(owner, tmp_path):
    store, _, ro = owner
    Migrator(store, raw_ttl_days=20000).migrate()
    store.insert("events", EVENT_COLS, [(1767225600.0, "j", "h", "xid", "", {}, "i", 1)])
    settings = Settings.load(env={}, store_path=store.path)
    endpoint = Endpoint.read(endpoint_path(store.path))
    assert endpoint is not None and endpoint.pid == os.getpid() and endpoint.url == ro.url
    assert oct(os.stat(endpoint_path(store.path)).st_mode & 0o777) == "0o600"
    reader = open_reader(settings)
    try:
        assert reader.backend == "clickhouse-connect"
        assert reader.query("SELECT count() FROM events").scalar() == 1
    finally:
        reader.close()
    with pytest.raises(StoreError, match="owned by process"):
        open_writer(settings)


def test_a_stale_endpoint_file_is_ignored(tmp_path):
    path = str(tmp_path / "chdb")
    s = ChdbStore(path)
    Migrator(s, raw_ttl_days=20000).migrate()
    s.close()
    stale = {
        "url": "http://127.0.0.1:9",
        "user": USER,
        "password": "x",
        "database": "stepwatch",
        "pid": 2**22 + 12345,
        "readonly": True,
    }
    endpoint_path(path).write_text(json.dumps(stale))
    reader = open_reader(Settings.load(env={}, store_path=path))
    try:
        assert reader.backend == "chdb"
        assert reader.query("SELECT count() FROM step_events").scalar() == 0
    finally:
        reader.close()


def test_the_server_backend_is_chosen_by_url(owner):
    _, rw, _ = owner
    settings = Settings.load(
        env={},
        clickhouse_url=rw.url,
        clickhouse_user=USER,
        clickhouse_password=rw.password,
        clickhouse_database="other",
    )
    writer = open_writer(settings)
    try:
        assert writer.backend == "clickhouse-connect"
        assert writer.query("SELECT currentDatabase()").scalar() == "other"
        Migrator(writer, raw_ttl_days=20000).migrate()
        names = writer.query("SHOW TABLES").column("name")
        assert set(R.TABLES) <= set(names)
    finally:
        writer.close()
    assert "secret" not in repr(settings.replace(clickhouse_password="secret"))


def test_the_endpoint_answers_like_clickhouse_http_to_curl_style_requests(owner):
    import base64
    import gzip
    import urllib.error
    import urllib.parse

    _, rw, _ = owner
    auth = {"X-ClickHouse-User": USER, "X-ClickHouse-Key": rw.password}

    def call(query: str | None = None, body: bytes = b"", headers: dict | None = None, **params):
        qs = urllib.parse.urlencode({**({"query": query} if query else {}), **params})
        req = urllib.request.Request(
            f"{rw.url}/?{qs}", data=body or None, headers={**auth, **(headers or {})}
        )
        with urllib.request.urlopen(req, timeout=10) as reply:
            return reply.read(), dict(reply.headers)

    out, headers = call("SELECT 1 + {x:UInt8} AS y", param_x="2", default_format="JSONEachRow")
    assert out == b'{"y":3}\n' and headers["X-ClickHouse-Format"] == "JSONEachRow"
    assert call("SELECT 'a' AS s FORMAT TSV")[0] == b"a\n"
    call(body=b"CREATE TABLE t (a UInt8) ENGINE = Memory", database="default")
    call(
        "INSERT INTO t FORMAT CSV",
        body=gzip.compress(b"1\n2\n3\n"),
        headers={"Content-Encoding": "gzip"},
        database="default",
    )
    assert call("SELECT sum(a) FROM t", database="default")[0] == b"6\n"
    basic = "Basic " + base64.b64encode(f"{USER}:{rw.password}".encode()).decode()
    assert call("SELECT 7", headers={"Authorization": basic, "X-ClickHouse-Key": ""})[0] == b"7\n"
    with pytest.raises(urllib.error.HTTPError) as err:
        call("SELECT nope_function()")
    assert err.value.headers["X-ClickHouse-Exception-Code"] == "46"
    assert err.value.read().startswith(b"Code: 46. DB::Exception:")


def test_no_purge_opens_the_store_after_the_endpoint_stopped(tmp_path):
    """The endpoint gives freed memory back a second after it goes idle; once stopped (and
    its store closed) it must not open that path again: chdb allows one path per process,
    so a late purge would stop this process from opening any other store."""
    import time

    first = str(tmp_path / "a")
    store = ChdbStore(first)
    service = QueryService(first, allow_writes=True).start()
    client = connect(service)
    assert client.query("SELECT 1 AS one").rows == [(1,)]  # idle after this: a purge is due
    client.close()
    service.stop()
    store.close()
    time.sleep(1.5)  # past the purge's delay
    assert service.purges == 0  # a late purge reopens the closed path (and may hold it while
    other = ChdbStore(str(tmp_path / "b"))  # this process opens another: chdb then refuses)
    other.close()
    served = QueryService(str(tmp_path / "b"), allow_writes=True).start()
    try:
        reader = connect(served)
        assert reader.query("SELECT 1 AS one").rows == [(1,)]
        reader.close()
        time.sleep(1.5)
        assert served.purges == 1  # while it runs, an idle endpoint does give memory back
    finally:
        served.stop()


def test_a_parameter_binds_the_same_in_the_engine_and_through_the_client(owner):
    """Data (a string with a quote and a backslash, a list) and text in ClickHouse's own
    form (:class:`ParamText`, as ``stepwatch sql -p`` sends it) give the same values
    directly and through the owner's endpoint. Before, a list had to be a ready-made
    literal string, which clickhouse-connect escaped into a String (the report failed
    whenever a sink or ``db serve`` owned the store)."""
    from stepwatch.exporters.clickhouse.store import ParamText

    store, rw, _ = owner
    sql = "SELECT {s:String} AS s, {l:Array(String)} AS l, {t:Array(UInt8)} AS t, {n:UInt32} AS n"
    params = {"s": "it's a\\b", "l": ["x'y", "z"], "t": ParamText("[1,2]"), "n": 7}
    client = connect(rw)
    try:
        through = client.query(sql, params).rows
    finally:
        client.close()
    assert store.query(sql, params).rows == through == [("it's a\\b", ["x'y", "z"], [1, 2], 7)]
