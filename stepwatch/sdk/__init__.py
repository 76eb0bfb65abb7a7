"""The step SDK: what a training script imports (``import stepwatch``).

Light by design: msgspec and the standard library on the hot path,
opentelemetry only when spans are enabled, torch never imported (CUDA events
are used when the script already runs torch with CUDA). See docs/sdk.md.
"""

from stepwatch.contract.wire import RankEvent, RankStep, decode_datagram, encode_datagram
from stepwatch.sdk.client import CheckpointTimer, StepWatch
from stepwatch.sdk.configure import init
from stepwatch.sdk.cuda import EventFactory, TimingEvent
from stepwatch.sdk.identity import Identity, Launcher, detect_identity
from stepwatch.sdk.phases import ALIASES, Phase, canonical
from stepwatch.sdk.step import PhaseTimer, Span, Step, StepHook

__all__ = [
    "ALIASES",
    "CheckpointTimer",
    "EventFactory",
    "Identity",
    "Launcher",
    "Phase",
    "PhaseTimer",
    "RankEvent",
    "RankStep",
    "Span",
    "Step",
    "StepHook",
    "StepWatch",
    "TimingEvent",
    "canonical",
    "decode_datagram",
    "detect_identity",
    "encode_datagram",
    "init",
]
