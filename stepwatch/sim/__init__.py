"""The fleet simulator (placeholder docstring, replaced below)."""

from stepwatch.sim.engine import simulate
from stepwatch.sim.frames import StepTable
from stepwatch.sim.io import read_labels, write_jsonl, write_labels
from stepwatch.sim.labels import EXPECTED, Cause, Detection, FaultClass, Label, ground_truth
from stepwatch.sim.scenario import DEFAULT_START_TS, Fault, FaultKind, Scenario, resolve_all
from stepwatch.sim.spec import parse_fault

__all__ = [
    "DEFAULT_START_TS",
    "EXPECTED",
    "Cause",
    "Detection",
    "Fault",
    "FaultClass",
    "FaultKind",
    "Label",
    "Scenario",
    "StepTable",
    "ground_truth",
    "parse_fault",
    "read_labels",
    "resolve_all",
    "simulate",
    "write_jsonl",
    "write_labels",
]
