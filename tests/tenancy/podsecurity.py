"""The Pod Security Standards' ``restricted`` profile (Kubernetes v1.34), as a list of what a pod
spec breaks: the render tests check every pod the operator renders against it without a
cluster; the cluster test lets the API server's own PodSecurity admission decide."""

from __future__ import annotations

from typing import Any

Spec = dict[str, Any]
ALLOWED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}
SECCOMP = {"RuntimeDefault", "Localhost"}


def restricted_violations(spec: Spec) -> list[str]:
    """Every rule of the profile ``spec`` (a pod spec) breaks, naming the container or volume."""
    found = [*_pod_level(spec), *_volumes(spec)]
    for container in _containers(spec):
        found += [f"container {container['name']}: {v}" for v in _container(spec, container)]
    return found


def _containers(spec: Spec) -> list[Spec]:
    return [
        *spec.get("initContainers", []),
        *spec.get("containers", []),
        *spec.get("ephemeralContainers", []),
    ]


def _pod_level(spec: Spec) -> list[str]:
    found = [f"{key} is true" for key in ("hostNetwork", "hostPID", "hostIPC") if spec.get(key)]
    context = spec.get("securityContext") or {}
    if context.get("runAsUser") == 0:
        found.append("pod runAsUser is 0")
    found += [f"sysctl {s['name']}" for s in context.get("sysctls", [])]
    return found


def _volumes(spec: Spec) -> list[str]:
    found = []
    for volume in spec.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= ALLOWED_VOLUMES:
            found.append(f"volume {volume['name']}: {sorted(kinds - ALLOWED_VOLUMES)} not allowed")
    return found


def _container(pod: Spec, container: Spec) -> list[str]:
    own = container.get("securityContext") or {}
    inherited = {**(pod.get("securityContext") or {}), **own}
    found = []
    if own.get("privileged"):
        found.append("privileged")
    if own.get("allowPrivilegeEscalation") is not False:
        found.append("allowPrivilegeEscalation is not false")
    if inherited.get("runAsNonRoot") is not True:
        found.append("runAsNonRoot is not true")
    if inherited.get("runAsUser") == 0:
        found.append("runAsUser is 0")
    if (inherited.get("seccompProfile") or {}).get("type") not in SECCOMP:
        found.append("seccompProfile is not RuntimeDefault or Localhost")
    capabilities = own.get("capabilities") or {}
    if "ALL" not in capabilities.get("drop", []):
        found.append("capabilities do not drop ALL")
    if set(capabilities.get("add", [])) - {"NET_BIND_SERVICE"}:
        found.append(f"capabilities add {capabilities['add']}")
    if any(p.get("hostPort") for p in container.get("ports", [])):
        found.append("hostPort")
    return found
