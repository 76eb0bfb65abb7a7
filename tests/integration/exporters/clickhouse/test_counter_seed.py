"""A counter a sample lacked keeps its baseline, in the rollups and across a sink restart.

NVML answers a failed call with no value: the sample holds the GPU's other
readings and no ``ecc_dbe_total``. The sink's next increase of that counter
must still count from the last value read, in the same run and after a
restart, when the baseline comes from the store's rows (real chdb).
"""

from __future__ import annotations

import time

from stepwatch.contract import GpuMessage, GpuReading, PortMessage, PortReading, encode
from stepwatch.exporters.clickhouse import rows as R
from stepwatch.exporters.clickhouse.chdb_backend import ChdbStore
from stepwatch.exporters.clickhouse.migrations import Migrator
from stepwatch.exporters.clickhouse.prepare import Preparer, Record

DBE = R.GPUS.names.index("ecc_dbe_new")
NVLINK = R.GPUS.names.index("nvlink_tx_bytes_per_s")


def sample(t: float, seq: int, dbe: int | None, nvlink: int) -> Record:
    reading = GpuReading(index=0, ecc_dbe_total=dbe, nvlink_tx_bytes_total=nvlink, power_w=300.0)
    msg = GpuMessage(host="n1", ts=t, inst="a", seq=seq, gpus=[reading])
    return Record("sc.gpu", 0, seq, encode(msg), b"n1")


def test_a_restarted_sink_counts_an_ecc_error_after_a_sample_without_the_counter(tmp_path):
    store = ChdbStore(str(tmp_path / "chdb"))
    try:
        Migrator(store).migrate()
        t0 = float(int(time.time()) - 100)  # whole seconds: ts is stored in ms
        before = Preparer(store)
        for seq, (dbe, nvlink) in enumerate([(5, 1000), (None, 2000)]):
            bucket = before.prepare([sample(t0 + 10 * seq, seq, dbe, nvlink)]).tables
            store.insert("gpu_samples", R.GPUS.names, bucket["gpu_samples"].rows)
        # a restarted sink: the baselines come from the store, ecc_dbe_total's from t0
        (row,) = Preparer(store).prepare([sample(t0 + 20, 2, 6, 3000)]).tables["gpu_samples"].rows
        assert row[DBE] == 1  # the double-bit error between t0 and t0 + 20
        assert row[NVLINK] == 100.0  # the other counter's rate over its own last tick
    finally:
        store.close()


def test_a_link_error_across_a_sample_without_its_counter_counts_whole_in_the_rollup(tmp_path):
    """The rollup totals a port counter as rate x interval: a rate taken over both
    intervals (the increase spans them) counted half the link error there."""
    store = ChdbStore(str(tmp_path / "chdb"))
    try:
        Migrator(store).migrate()
        t0 = float(int(time.time()) // 60 * 60 - 120)  # one minute, whole seconds
        prep = Preparer(store)
        for seq, (downed, sent) in enumerate([(5, 10**6), (None, 2 * 10**6), (6, 3 * 10**6)]):
            reading = PortReading(device="mlx5_0", port=1, link_downed_total=downed,
                                  xmit_bytes_total=sent)  # fmt: skip
            msg = PortMessage(host="n1", ts=t0 + 10 * seq, inst="a", seq=seq, ports=[reading])
            rows = prep.prepare([Record("sc.ports", 0, seq, encode(msg), b"n1")]).tables
            store.insert("port_samples", R.PORTS.names, rows["port_samples"].rows)
        ((errors, sent),) = store.query(
            "SELECT sum(link_errors), sum(xmit_bytes) FROM port_rollup_1m"
        ).rows
        assert (errors, sent) == (1.0, 2.0 * 10**6)
    finally:
        store.close()
