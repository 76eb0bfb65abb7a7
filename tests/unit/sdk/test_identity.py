"""Identity detection from each launcher's environment, and its precedence rules."""

from __future__ import annotations

import dataclasses

import pytest

from stepwatch.sdk.identity import UNKNOWN_JOB, Identity, Launcher, detect_identity

TORCHRUN = {
    "RANK": "11",
    "LOCAL_RANK": "3",
    "WORLD_SIZE": "16",
    "LOCAL_WORLD_SIZE": "8",
    "GROUP_RANK": "1",
    "TORCHELASTIC_RUN_ID": "llama-run-42",
}
SLURM = {
    "SLURM_JOB_ID": "812345",
    "SLURM_PROCID": "9",
    "SLURM_LOCALID": "1",
    "SLURM_NTASKS": "16",
    "SLURM_TASKS_PER_NODE": "8(x2)",
    "SLURM_NODEID": "1",
    "SLURMD_NODENAME": "node02",
}
K8S = {
    "KUBERNETES_SERVICE_HOST": "10.0.0.1",
    "POD_NAME": "llama-worker-3",
    "POD_NAMESPACE": "team-a",
    "NODE_NAME": "gpu-node-7",
    "JOB_COMPLETION_INDEX": "3",
}


def detect(env: dict[str, str], **explicit: object) -> Identity:
    return detect_identity(env, hostname=lambda: "box1", **explicit)


def test_torchrun() -> None:
    ident = detect(TORCHRUN)
    assert (ident.job_id, ident.rank, ident.world_size) == ("llama-run-42", 11, 16)
    assert (ident.local_rank, ident.local_world_size, ident.node_rank) == (3, 8, 1)
    assert ident.launcher is Launcher.TORCHRUN
    assert ident.host == "box1"
    assert ident.gpu is None  # no CUDA_VISIBLE_DEVICES: defaults to local_rank downstream
    assert ident.group == "all"


def test_torchrun_default_run_id_is_not_a_job_id() -> None:
    ident = detect({**TORCHRUN, "TORCHELASTIC_RUN_ID": "none"})
    assert ident.job_id == UNKNOWN_JOB


@pytest.mark.parametrize(
    ("tasks", "node", "want"),
    [
        ("2,1(x3)", "0", 2),  # real Slurm 22.05, sbatch -N4 -n5 (srun's tasks read it)
        ("2,3(x3)", "2", 3),
        ("2(x3),1", "0", 2),
        ("2(x3),1", "2", 2),
        ("2(x3),3", "3", 3),  # before: the heterogeneous form was ignored (1 for every node)
        ("4,8(x2)", "1", 8),
        ("8(x2)", "", 8),  # no node id: the count all nodes share
        ("2(x3),1", "", 1),  # no node id and they differ: not known (the default)
        ("2(x3),1", "9", 1),  # past the list: not known
        ("2(x3)),1", "0", 1),  # not Slurm's form: ignored
    ],
)
def test_slurm_tasks_per_node_heterogeneous(tasks: str, node: str, want: int) -> None:
    env = {k: v for k, v in SLURM.items() if k not in ("SLURM_NODEID", "SLURM_LOCALID")}
    ident = detect({**env, "SLURM_TASKS_PER_NODE": tasks, "SLURM_NODEID": node})
    assert ident.local_world_size == want


def test_torchrun_without_rdzv_id_is_named_by_its_store() -> None:
    """torchrun's run id is ``none`` without ``--rdzv-id`` (a c10d rendezvous): every such
    job said ``unknown`` and all were analysed as one. The address of its store (the
    rank-0 agent's host name and a port it picked) is shared by the run's ranks."""
    env = {**TORCHRUN, "TORCHELASTIC_RUN_ID": "none", "MASTER_PORT": "38009"}
    assert detect({**env, "MASTER_ADDR": "node07"}).job_id == "torchrun-node07-38009"
    # a loopback name stays as it is: per host, a multi-node job would split by node
    assert detect({**env, "MASTER_ADDR": "localhost"}).job_id == "torchrun-localhost-38009"
    # a named job wins; a run id that is not "none" wins; no store address: unknown
    assert detect({**env, "MASTER_ADDR": "node07", "SLURM_JOB_ID": "77"}).job_id == "77"
    assert detect({**env, "TORCHELASTIC_RUN_ID": "r1", "MASTER_ADDR": "n"}).job_id == "r1"
    assert detect({**env, "MASTER_PORT": "x", "MASTER_ADDR": "n"}).job_id == UNKNOWN_JOB
    plain = {"MASTER_ADDR": "node07", "MASTER_PORT": "29500", "RANK": "0"}  # not torchrun
    assert detect(plain).job_id == UNKNOWN_JOB


def test_slurm() -> None:
    ident = detect(SLURM)
    assert (ident.job_id, ident.rank, ident.world_size) == ("812345", 9, 16)
    assert (ident.local_rank, ident.local_world_size, ident.node_rank) == (1, 8, 1)
    assert ident.host == "node02"
    assert ident.launcher is Launcher.SLURM


def test_torchrun_under_slurm_takes_rank_from_torchrun_and_job_from_slurm() -> None:
    ident = detect({**SLURM, **TORCHRUN})
    assert ident.rank == 11 and ident.local_rank == 3
    assert ident.job_id == "812345"  # what scontrol requeue/drain act on
    assert ident.host == "node02"
    assert ident.launcher is Launcher.TORCHRUN


def test_kubernetes_indexed_job() -> None:
    ident = detect({**K8S, "WORLD_SIZE": "8"})
    assert ident.launcher is Launcher.KUBERNETES
    assert ident.rank == 3 and ident.world_size == 8
    assert (ident.pod, ident.namespace, ident.host) == ("llama-worker-3", "team-a", "gpu-node-7")
    assert ident.job_id == "team-a/llama"  # PyTorchJob pod naming <job>-worker-<n>


def test_kubernetes_job_id_from_downward_api_wins() -> None:
    ident = detect({**K8S, "WORLD_SIZE": "8", "STEPWATCH_JOB_ID": "llama-7b-0412"})
    assert ident.job_id == "llama-7b-0412"


def test_kubernetes_pytorchjob_uses_torchrun_variables() -> None:
    env = {**K8S, "RANK": "5", "WORLD_SIZE": "8"}
    del env["JOB_COMPLETION_INDEX"]
    ident = detect(env)
    assert ident.rank == 5 and ident.launcher is Launcher.TORCHRUN


def test_precedence_explicit_then_stepwatch_env_then_launcher() -> None:
    env = {
        **TORCHRUN,
        "STEPWATCH_RANK": "4",
        "STEPWATCH_JOB_ID": "env-job",
        "STEPWATCH_HOST": "h-env",
        "STEPWATCH_GROUP": "pp1",
        "STEPWATCH_GPU": "6",
    }
    from_env = detect(env)
    assert (from_env.rank, from_env.job_id, from_env.host) == (4, "env-job", "h-env")
    assert (from_env.group, from_env.gpu) == ("pp1", 6)
    assert from_env.launcher is Launcher.EXPLICIT
    explicit = detect(env, rank=5, job_id="arg-job", host="h-arg", group="pp3", gpu=2)
    assert (explicit.rank, explicit.job_id, explicit.host) == (5, "arg-job", "h-arg")
    assert (explicit.group, explicit.gpu) == ("pp3", 2)


def test_garbage_values_are_skipped_never_raised() -> None:
    env = {
        "RANK": "three",
        "SLURM_PROCID": "2",
        "WORLD_SIZE": "-4",
        "SLURM_NTASKS": "8",
        "LOCAL_RANK": "",
        "STEPWATCH_GPU": "gpu0",
    }
    ident = detect(env, rank="x", world_size=None, colour="blue")
    assert ident.rank == 2 and ident.world_size == 8
    assert ident.local_rank == 0 and ident.gpu is None


def test_rank_beyond_world_size_is_made_consistent() -> None:
    ident = detect({"RANK": "9", "WORLD_SIZE": "4"})
    assert ident.world_size == 10


@pytest.mark.parametrize(
    ("visible", "local_rank", "gpu"),
    [("3", "0", 3), ("4,5,6,7", "2", 6), ("GPU-8a1f,GPU-77c2", "1", None), ("0,1", "5", None)],
)
def test_gpu_from_cuda_visible_devices(visible: str, local_rank: str, gpu: int | None) -> None:
    ident = detect({"CUDA_VISIBLE_DEVICES": visible, "LOCAL_RANK": local_rank})
    assert ident.gpu == gpu


def test_nothing_set_is_a_single_process() -> None:
    ident = detect({})
    assert ident == Identity(host="box1")
    assert ident.launcher is Launcher.NONE


def test_identity_is_frozen() -> None:
    ident = detect(TORCHRUN)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ident.rank = 0  # type: ignore[misc]
    assert ident.replace(group="pp3").group == "pp3" and ident.group == "all"


@pytest.mark.parametrize("visible", ["0,1,²,3", "0,1,٣,3", "0,1,①,3"])
def test_a_non_ascii_digit_in_cuda_visible_devices_costs_the_gpu_not_the_identity(
    visible: str,
) -> None:
    """Before, ``str.isdigit`` took "²" (and other digits ``int`` refuses), the ValueError
    escaped detection and ``init`` fell back to ``Identity()``: job "unknown", rank 0, the
    explicit job id and rank lost, every rank announcing itself as rank 0."""
    import stepwatch

    env = {"CUDA_VISIBLE_DEVICES": visible, "LOCAL_RANK": "2"}
    ident = detect(env, job_id="job-7", rank=3, world_size=8)
    assert (ident.job_id, ident.rank, ident.world_size, ident.local_rank) == ("job-7", 3, 8, 2)
    assert ident.gpu is None
    sw = stepwatch.init("job-7", rank=3, world_size=8, env=env, agent_socket="/nonexistent/a")
    try:
        assert (sw.identity.job_id, sw.identity.rank) == ("job-7", 3)
    finally:
        sw.close(0.5)
