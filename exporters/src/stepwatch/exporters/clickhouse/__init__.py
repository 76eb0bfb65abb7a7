"""The historical store: ClickHouse schema, the Kafka sink, saved queries.

Backends (:mod:`.chdb_backend`, :mod:`.connect_backend`) implement
:class:`~stepwatch.exporters.clickhouse.store.Store`; :mod:`.access` picks one from the
settings. See docs/store.md.
"""
