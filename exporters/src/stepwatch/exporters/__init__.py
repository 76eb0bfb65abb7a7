"""Exporters: where stepwatch data goes after Kafka (see ``stepwatch.exporters.clickhouse``)."""
