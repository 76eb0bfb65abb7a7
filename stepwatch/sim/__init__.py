"""The fleet simulator: realistic training telemetry with injected faults and ground truth.

Used by the tests, the demo and the benchmarks. The model (what each number
means and why) is described in docs/simulator.md; this is the API::

    from stepwatch.sim import Scenario, Fault, FaultKind, Label, simulate, ground_truth

    sc = Scenario(
        seed=1, job_id="job-1", nodes=4, gpus_per_node=8, nics_per_node=8, steps=300,
        step_seconds=1.0, pipeline_stages=1, hosts=None,          # or ("node0007", ...)
        start_ts=DEFAULT_START_TS,                                # fixed: reproducible
        faults=(Fault(FaultKind.SLOW_GPU, rank=5, start_step=100, severity=0.10),),
        warmup_steps=10, eval_every=100, checkpoint_every=150, jitter=0.01,
        samples_per_step=8, tokens_per_step=32768, flops_per_token=None,
        with_gpu=True, with_ports=True, tick_seconds=1.0, realtime=False,
    )
    for message in simulate(sc, other_scenario):   # contract messages, time-ordered,
        ...                                        # deterministic given the seeds
    labels = ground_truth(sc, other_scenario)      # list[Label], frozen, JSON via to_dict()
    write_jsonl("events.jsonl", simulate(sc))      # returns the count
    write_labels("labels.json", labels)            # read back with read_labels()

``Fault(kind, rank=None, host=None, gpu=None, start_step=100, end_step=None,
severity=0.10, nic=None, duration_seconds=None)``; an unspecified target is
drawn from the scenario's seed. :class:`FaultKind`: SLOW_GPU, THERMAL_THROTTLE,
POWER_THROTTLE, NIC_CONGESTION, LINK_FLAP, XID79, XID48, DATALOADER_STALL,
JOB_HANG, RANK_CRASH, and two additions: SLOW_RANK (slow with no explaining
signal: cause ``unknown``) and NAN_LOSS (a user error). :data:`EXPECTED` maps
each kind to its expected detection type, cause, fault class and action.

:class:`Label` fields: ``job_id``, ``kind``, ``detection`` (straggler | hang |
rank_missing | user_error | link_flap), ``accepted`` (other detection types that
also count), ``cause`` (gpu | network | host_input | hardware | user |
unknown), ``fault_class`` (system | user), ``action``, ``ranks``, ``rank`` (when
exactly one), ``host``, ``gpu``, ``device``/``port`` (network faults),
``group``, ``severity``, ``start_step``, ``start_ts``, ``end_step``, ``end_ts``,
``summary``.

Realtime: ``Scenario(realtime=True)`` starts when simulated; call
:func:`resolve_all` once and pass its result to both :func:`simulate` and
:func:`ground_truth` so their clocks agree (``stepwatch simulate --realtime``
does this and paces the output at wall-clock time).

Helpers: :class:`StepTable` gathers step records into (step x rank) arrays;
:func:`parse_fault` reads the command-line form ``slow_gpu:rank=5:start=100``.
"""

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
