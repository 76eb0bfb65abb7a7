"""Kubernetes with the official client: cordon, taint, delete the job's pods on the node.

- drain: cordon (``spec.unschedulable``), add the taint
  ``stepwatch.io/remediation=stepwatch:NoSchedule`` and annotate the node with
  the reason (``stepwatch.io/drain-reason``): the taint and that annotation
  together are how a stepwatch cordon is told from a person's.
- requeue: delete the job's pods on the node (label ``stepwatch.io/job-id``,
  configurable); the job's controller (Job, JobSet, PyTorchJob) recreates
  them and the cordon keeps them off the node. They resume from the last
  checkpoint as on any restart.

API errors 429 and 5xx (and no answer) are transient; other 4xx permanent.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from stepwatch.alerts.remediate.actuators.base import NodeState
from stepwatch.alerts.remediate.identity import require_job, require_node
from stepwatch.errors import ActuatorError

TAINT_KEY = "stepwatch.io/remediation"
REASON_ANNOTATION = "stepwatch.io/drain-reason"
T = TypeVar("T")


def _our_reason(node: Any) -> str:
    """The drain reason stepwatch left, while its taint is on the node ('' otherwise).

    ``kubectl uncordon`` leaves annotations (and taints) alone: a reason annotation alone
    made a person's later ``kubectl cordon`` read as stepwatch's, and the node was
    drained and its pods deleted again over the person's cordon. Returning a node to
    service takes the taint off (docs/runbooks.md); a cordon without it is a person's."""
    if not any(t.key == TAINT_KEY for t in (node.spec.taints or [])):
        return ""
    return str((node.metadata.annotations or {}).get(REASON_ANNOTATION, ""))


class KubeActuator:
    name = "kubernetes"

    def __init__(self, core: Any, job_label: str = "stepwatch.io/job-id") -> None:
        self.core = core  # a kubernetes.client.CoreV1Api (or a fake in tests)
        self.job_label = job_label

    @classmethod
    def from_config(cls, spec: Mapping[str, Any]) -> KubeActuator:
        from kubernetes import client, config

        try:
            if spec.get("in_cluster"):
                config.load_incluster_config()
            else:
                config.load_kube_config(
                    config_file=spec.get("kubeconfig"), context=spec.get("context")
                )
        except Exception as err:  # the client raises several unrelated types
            raise ActuatorError(
                f"cannot load the Kubernetes config: {err}", transient=False
            ) from err
        return cls(client.CoreV1Api(), str(spec.get("job_label", "stepwatch.io/job-id")))

    def _call(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        from kubernetes.client.exceptions import ApiException

        try:
            return fn(*args, **kwargs)
        except ApiException as err:
            transient = err.status in (429, 0) or (err.status or 0) >= 500
            raise ActuatorError(
                f"kubernetes {what}: {err.status} {err.reason}", transient=transient
            ) from err
        except OSError as err:  # urllib3 connection errors derive from OSError
            raise ActuatorError(f"kubernetes {what}: {err}", transient=True) from err

    def node_state(self, node: str) -> NodeState:
        from kubernetes.client.exceptions import ApiException

        require_node(node)
        try:
            obj = self.core.read_node(node)
        except ApiException as err:
            if err.status == 404:
                return NodeState(False, False)
            raise ActuatorError(
                f"kubernetes read node {node}: {err.status} {err.reason}",
                transient=err.status == 429 or (err.status or 0) >= 500,
            ) from err
        return NodeState(True, bool(obj.spec.unschedulable), _our_reason(obj))

    def node_count(self) -> int:
        return len(self._call("list nodes", self.core.list_node).items)

    def drain(self, node: str, reason: str) -> str:
        from kubernetes import client

        obj = self._call("read node", self.core.read_node, require_node(node))
        taints = [t for t in (obj.spec.taints or []) if t.key != TAINT_KEY]
        taints.append(client.V1Taint(key=TAINT_KEY, value="stepwatch", effect="NoSchedule"))
        body = {
            "spec": {
                "unschedulable": True,
                "taints": [self.core.api_client.sanitize_for_serialization(t) for t in taints],
            },
            "metadata": {"annotations": {REASON_ANNOTATION: reason}},
        }
        self._call("patch node", self.core.patch_node, node, body)
        return f"cordoned and tainted {node}"

    def job_owner(self, job_id: str) -> str:
        return ""  # Kubernetes has no job owner: give the alert an `owner` label

    def job_nodes(self, job_id: str) -> frozenset[str] | None:
        """The nodes the job's pods are scheduled on (label ``job_label``)."""
        pods = self._pods(job_id)
        return frozenset(p.spec.node_name for p in pods if p.spec is not None and p.spec.node_name)

    def requeue(self, job_id: str, exclude_node: str) -> str:
        pods = self._pods(job_id, f"spec.nodeName={require_node(exclude_node)}")
        for pod in pods:
            self._call(
                "delete pod",
                self.core.delete_namespaced_pod,
                pod.metadata.name,
                pod.metadata.namespace,
            )
        return f"deleted {len(pods)} pod(s) of job {job_id} on {exclude_node}"

    def _pods(self, job_id: str, field_selector: str = "") -> Any:
        """The job's pods: ``namespace/value`` lists that namespace's pods labelled
        ``value`` only (before, every namespace's: another tenant's pod labelled the same
        made its node one of the job's, and a requeue deleted it too); a plain value,
        every namespace's (the label is the job's whole identity then)."""
        namespace, _, name = require_job(job_id, "label").rpartition("/")
        args: dict[str, str] = {"label_selector": f"{self.job_label}={name}"}
        if field_selector:
            args["field_selector"] = field_selector
        if namespace:
            return self._call("list pods", self.core.list_namespaced_pod, namespace, **args).items
        return self._call("list pods", self.core.list_pod_for_all_namespaces, **args).items
