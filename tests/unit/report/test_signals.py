"""Report helpers: the throttle reason of a flagged GPU; where a reader finds the store."""

from __future__ import annotations

import pytest

from stepwatch.errors import StoreError
from stepwatch.exporters.clickhouse.access import DEMO_STORE_PATH, reader_settings
from stepwatch.settings import Settings

pytestmark = pytest.mark.unit


def test_throttle_reason_names_thermal_and_power_with_their_share() -> None:
    pytest.importorskip("numpy")
    from stepwatch.report.signals import throttle_reason

    assert throttle_reason([0x40, 0x60, 0x0, None]) == "thermal 67 %"
    assert throttle_reason([0x4, 0x4, 0x80, 0x0]) == "power 75 %"
    assert throttle_reason([0x1, 0x0]) == ""  # idle is no throttle


def test_a_reader_on_the_default_path_finds_the_demo_store(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / DEMO_STORE_PATH).mkdir(parents=True)
    assert reader_settings(Settings.load(env={})).store_path == DEMO_STORE_PATH
    (tmp_path / "var" / "chdb").mkdir()
    assert reader_settings(Settings.load(env={})).store_path == "var/chdb"
    explicit = Settings.load(env={}, store_path="elsewhere")
    assert reader_settings(explicit).store_path == "elsewhere"


def test_a_reader_with_no_store_is_told_where_it_looked(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(StoreError, match=r"var/chdb .*var/demo/chdb.*--store-path"):
        reader_settings(Settings.load(env={}))


def test_a_stored_name_with_dollar_signs_is_text_not_math() -> None:
    """A NIC named ``mlx$\\nope$`` (a legend label) was read as math: its unknown symbol
    made savefig raise and the whole report failed."""
    pytest.importorskip("matplotlib")
    from stepwatch.report.figures import _plt, _png

    plt = _plt()
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1], label="mlx$\\nope$")
    ax.set_title("job$\\nope$ on n$\\frac{$")
    ax.legend()
    assert _png(fig).startswith(b"\x89PNG")
