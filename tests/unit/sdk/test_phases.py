"""Phase names -> contract Phases fields (aliases, normalisation, extra)."""

from __future__ import annotations

import pytest

from stepwatch.contract.records import Phases
from stepwatch.sdk.phases import MAX_EXTRA, Phase, canonical, to_phases


@pytest.mark.parametrize(
    ("name", "phase"),
    [
        ("data", Phase.DATA),
        ("forward", Phase.FORWARD),
        ("backward", Phase.BACKWARD),
        ("optimizer", Phase.OPTIMIZER),
        ("comm_wait", Phase.COMM_WAIT),
        ("checkpoint", Phase.CHECKPOINT),
        # Megatron timers
        ("batch-generator", Phase.DATA),
        ("forward-backward", Phase.FORWARD),
        ("all-grads-sync", Phase.COMM_WAIT),
        ("optimizer", Phase.OPTIMIZER),
        # TorchTitan, spelling variants
        ("data_loading", Phase.DATA),
        ("Comm-Wait", Phase.COMM_WAIT),
        (" all_grads_sync ", Phase.COMM_WAIT),
        ("FWD", Phase.FORWARD),
    ],
)
def test_known_names(name: str, phase: Phase) -> None:
    assert canonical(name) is phase


def test_unknown_name_goes_to_extra_as_given() -> None:
    phases, dropped = to_phases([("forward", 0.2), ("embedding-grads-sync", 0.01)])
    assert phases == Phases(forward=0.2, extra={"embedding-grads-sync": 0.01})
    assert dropped == 0


def test_repeated_phases_are_summed() -> None:
    # gradient accumulation: forward/backward run several times per step
    phases, _ = to_phases(
        [
            ("forward", 0.1),
            ("backward", 0.2),
            ("forward", 0.1),
            ("backward", 0.2),
            ("all-grads-sync", 0.05),
            ("comm_wait", 0.01),
        ]
    )
    assert phases.forward == pytest.approx(0.2)
    assert phases.backward == pytest.approx(0.4)
    assert phases.comm_wait == pytest.approx(0.06)
    assert phases.data is None  # not measured, not zero


def test_extra_names_are_capped() -> None:
    spans = [(f"section-{i}", 0.001) for i in range(MAX_EXTRA + 5)]
    phases, dropped = to_phases(spans)
    assert len(phases.extra) == MAX_EXTRA
    assert dropped == 5
