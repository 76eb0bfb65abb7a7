"""Exporters: where stepwatch data goes after Kafka (see ``exporters.clickhouse``)."""
