"""decode's fast path for step messages with no negative number gives the full check's verdict."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from stepwatch.contract import Phases, StepMessage, StepRecord, check_values, decode, encode
from stepwatch.contract.codec import decode_unchecked
from stepwatch.errors import ContractError

NOW = 1_800_000_000.0
times = st.one_of(
    st.just(NOW - 10),
    st.just(NOW - 9),
    st.just(0.0),
    st.just(NOW + 1000),
    st.just(NOW - 9 - 8 * 24 * 3600),
    st.floats(0, NOW + 400),
    st.just(-1.0),
)
counts = st.one_of(st.just(1), st.just(4), st.integers(-1, 5))


@st.composite
def records(draw: st.DrawFn) -> StepRecord:
    phase = st.one_of(st.none(), st.just(0.5), st.floats(-1, 2))
    phases = draw(
        st.one_of(
            st.none(),
            st.builds(
                Phases,
                data=phase,
                forward=phase,
                comm_wait=phase,
                extra=st.dictionaries(st.sampled_from(["a", "eval"]), st.floats(-1, 2), max_size=2),
            ),
        )
    )
    return StepRecord(
        job_id="j-1",
        rank=draw(counts),
        world_size=draw(counts),
        step=draw(counts),
        start=draw(times),
        end=draw(times),
        phases=phases,
        samples=draw(counts),
        tokens=draw(counts),
        loss=draw(st.one_of(st.none(), st.floats(-3, 3), st.just(-math.inf))),
    )


def verdict(call: object) -> tuple[str, str] | None:
    try:
        call()  # type: ignore[operator]
    except ContractError as err:
        return err.reason, err.detail
    return None


def reference(data: bytes) -> None:
    check_values(decode_unchecked(data), NOW)


@settings(max_examples=300, deadline=None)
@given(st.lists(records(), max_size=4), st.sampled_from([NOW - 5, NOW + 1000, 0.0]))
def test_step_decode_verdict_and_reason_match_the_full_check(
    steps: list[StepRecord], ts: float
) -> None:
    data = encode(StepMessage(host="h-1", ts=ts, job_id="j-1", steps=steps))
    want = verdict(lambda: reference(data))
    assert verdict(lambda: decode(data, now=lambda: NOW)) == want
    assert verdict(lambda: decode(data.decode(), now=lambda: NOW)) == want
