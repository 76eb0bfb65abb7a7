"""Which store to open: a server, the owner's endpoint, or the embedded path.

* ``Settings.clickhouse_url`` set: the server (clickhouse-connect), for everyone.
* Otherwise the embedded store at ``Settings.store_path`` has one owner. A
  writer (the sink, ``db serve``, ``db migrate``) opens the path itself and
  fails clearly when a live owner holds it. A reader uses the live owner's
  endpoint when there is one, and opens the path itself (read-only) when not.
"""

from __future__ import annotations

import logging

from stepwatch.errors import StoreError
from stepwatch.exporters.clickhouse.service import Endpoint, endpoint_path
from stepwatch.exporters.clickhouse.store import Store
from stepwatch.settings import Settings

log = logging.getLogger(__name__)


def live_endpoint(settings: Settings) -> Endpoint | None:
    if settings.clickhouse_url:
        return None
    return Endpoint.read(endpoint_path(settings.store_path))


def open_server(settings: Settings, *, create_database: bool = True) -> Store:
    from stepwatch.exporters.clickhouse.connect_backend import ClickHouseConnectStore

    return ClickHouseConnectStore(
        settings.clickhouse_url, settings.clickhouse_user, settings.clickhouse_password,
        settings.clickhouse_database, create_database=create_database,
    )


def open_writer(settings: Settings) -> Store:
    """The store a writer owns: the server, or the embedded path (exclusively)."""
    if settings.clickhouse_url:
        return open_server(settings)
    owner = live_endpoint(settings)
    if owner is not None:
        raise StoreError(
            f"the store at {settings.store_path} is owned by process {owner.pid} "
            f"(endpoint {owner.url}); stop it first, or let it do the writing"
        )
    from stepwatch.exporters.clickhouse.chdb_backend import ChdbStore

    return ChdbStore(settings.store_path, settings.clickhouse_database)


def open_reader(settings: Settings) -> Store:
    """A store to query: the server, the live owner's endpoint, or the path read-only."""
    if settings.clickhouse_url:
        return open_server(settings, create_database=False)
    owner = live_endpoint(settings)
    if owner is not None:
        from stepwatch.exporters.clickhouse.connect_backend import ClickHouseConnectStore

        log.debug("reading through the owner's endpoint url=%s pid=%d", owner.url, owner.pid)
        return ClickHouseConnectStore(owner.url, owner.user, owner.password,
                                      settings.clickhouse_database, create_database=False)
    from stepwatch.exporters.clickhouse.chdb_backend import ChdbStore

    return ChdbStore(settings.store_path, settings.clickhouse_database, readonly=True)
