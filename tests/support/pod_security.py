"""The Pod Security Standards' "baseline" and "restricted" rules that a pod spec can break
(kubernetes.io/docs/concepts/security/pod-security-standards, the fields of the policy
levels as of Kubernetes 1.30), over a pod spec as written in YAML (camelCase)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

BASELINE_CAPS = {
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
}
RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}


def _containers(spec: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for key in ("initContainers", "containers", "ephemeralContainers"):
        yield from spec.get(key) or []


def baseline(spec: dict[str, Any]) -> list[str]:
    out = [f"host namespace {k}" for k in ("hostNetwork", "hostPID", "hostIPC") if spec.get(k)]
    out += [f"hostPath volume {v['name']}" for v in spec.get("volumes") or [] if "hostPath" in v]
    psc = spec.get("securityContext") or {}
    out += [
        f"sysctl {s['name']}" for s in psc.get("sysctls") or [] if s["name"] not in SAFE_SYSCTLS
    ]
    if (psc.get("seccompProfile") or {}).get("type") == "Unconfined":
        out.append("pod seccomp Unconfined")
    for c in _containers(spec):
        sc = c.get("securityContext") or {}
        name = c["name"]
        if sc.get("privileged"):
            out.append(f"{name}: privileged")
        extra = set((sc.get("capabilities") or {}).get("add") or []) - BASELINE_CAPS
        out += [f"{name}: adds capability {cap}" for cap in sorted(extra)]
        out += [
            f"{name}: hostPort {p['hostPort']}" for p in c.get("ports") or [] if p.get("hostPort")
        ]
        if sc.get("procMount", "Default") != "Default":
            out.append(f"{name}: procMount")
        if (sc.get("seccompProfile") or {}).get("type") == "Unconfined":
            out.append(f"{name}: seccomp Unconfined")
    return out


def restricted(spec: dict[str, Any]) -> list[str]:
    out = baseline(spec)
    for v in spec.get("volumes") or []:
        kinds = set(v) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            out.append(f"volume {v['name']} of type {sorted(kinds)}")
    psc = spec.get("securityContext") or {}
    for c in _containers(spec):
        sc, name = c.get("securityContext") or {}, c["name"]
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{name}: allowPrivilegeEscalation must be false")
        if not sc.get("runAsNonRoot", psc.get("runAsNonRoot")):
            out.append(f"{name}: runAsNonRoot must be true")
        if sc.get("runAsUser", psc.get("runAsUser")) == 0:
            out.append(f"{name}: runAsUser 0")
        seccomp = (sc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"{name}: seccompProfile must be RuntimeDefault or Localhost")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            out.append(f"{name}: must drop ALL capabilities")
        out += [f"{name}: adds {cap}" for cap in caps.get("add") or [] if cap != "NET_BIND_SERVICE"]
    return out
