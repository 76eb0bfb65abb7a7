"""Which store to open: a server, the owner's endpoint, or the embedded path.

* ``Settings.clickhouse_url`` set: the server (clickhouse-connect), for everyone.
* Otherwise the embedded store at ``Settings.store_path`` has one owner. A
  writer (the sink, ``db serve``, ``db migrate``) opens the path itself and
  fails clearly when a live owner holds it. A reader uses the live owner's
  endpoint when there is one, and opens the path itself (read-only) when not.
* A reader left on the default path (``var/chdb``) where no store is, while the
  demo's store (``var/demo/chdb``) is there, reads the demo's store (and says so
  in the log); with neither, the error names both places and how to choose.
"""

from __future__ import annotations

import logging
import os

from stepwatch.errors import StoreError
from stepwatch.exporters.clickhouse.service import Endpoint, endpoint_path
from stepwatch.exporters.clickhouse.store import Store
from stepwatch.settings import Settings

log = logging.getLogger(__name__)

DEMO_STORE_PATH = "var/demo/chdb"  # `stepwatch demo`'s store (its default --workdir)


def _present(path: str) -> bool:
    return os.path.isdir(path) or Endpoint.read(endpoint_path(path)) is not None


def reader_settings(settings: Settings) -> Settings:
    """The settings a reader uses: the demo's store when the default path holds none."""
    if settings.clickhouse_url or settings.sources.get("store_path", "default") != "default":
        return settings
    if _present(settings.store_path):
        return settings
    if _present(DEMO_STORE_PATH):
        log.info(
            "no store at the default path, reading the demo's store path=%s default=%s",
            DEMO_STORE_PATH,
            settings.store_path,
        )
        return settings.replace(store_path=DEMO_STORE_PATH)
    raise StoreError(
        f"no store at {settings.store_path} (the default) nor at {DEMO_STORE_PATH} (the demo's): "
        "pass --store-path DIR (or set STEPWATCH_STORE_PATH), --clickhouse-url for a server, "
        "or create one with `stepwatch db migrate` / `stepwatch db sink`"
    )


def live_endpoint(settings: Settings) -> Endpoint | None:
    if settings.clickhouse_url:
        return None
    return Endpoint.read(endpoint_path(settings.store_path))


def open_server(settings: Settings, *, create_database: bool = True) -> Store:
    """A server; on a cluster every query carries :data:`cluster.CLIENT_SETTINGS`."""
    from stepwatch.exporters.clickhouse.cluster import CLIENT_SETTINGS
    from stepwatch.exporters.clickhouse.connect_backend import ClickHouseConnectStore

    return ClickHouseConnectStore(
        settings.clickhouse_url,
        settings.clickhouse_user,
        settings.clickhouse_password,
        settings.clickhouse_database,
        create_database=create_database,
        settings=CLIENT_SETTINGS if settings.clickhouse_cluster else None,
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
    """A store to query: the server, the live owner's endpoint, or the path read-only
    (the default path falls back to the demo's store: :func:`reader_settings`)."""
    settings = reader_settings(settings)
    if settings.clickhouse_url:
        return open_server(settings, create_database=False)
    owner = live_endpoint(settings)
    if owner is not None:
        from stepwatch.exporters.clickhouse.connect_backend import ClickHouseConnectStore

        log.debug("reading through the owner's endpoint url=%s pid=%d", owner.url, owner.pid)
        return ClickHouseConnectStore(
            owner.url,
            owner.user,
            owner.password,
            settings.clickhouse_database,
            create_database=False,
        )
    from stepwatch.exporters.clickhouse.chdb_backend import ChdbStore

    return ChdbStore(settings.store_path, settings.clickhouse_database, readonly=True)
