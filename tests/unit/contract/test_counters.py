from __future__ import annotations

from stepwatch.contract.counters import WRAP_32, delta, rate


def test_normal_increase() -> None:
    assert delta(100, 150) == 50
    assert rate(100, 150, 2.0) == 25.0


def test_reset_counts_from_zero() -> None:
    assert delta(1_000_000, 40) == 40


def test_wrap_of_32_bit_counter() -> None:
    assert delta(WRAP_32 - 10, 5, wrap=WRAP_32) == 15


def test_low_value_decrease_is_reset_even_with_wrap() -> None:
    assert delta(1000, 5, wrap=WRAP_32) == 5


def test_missing_or_bad_interval() -> None:
    assert delta(None, 5) is None
    assert rate(1, 2, 0.0) is None
