"""When a pod meant for the local nodes cannot get CPU, say so in words (pure).

The scheduler already keeps such a pod Pending (``Insufficient cpu``); the runtime adds what a
person needs to act: what the local nodes offer, what their pods take, what this pod asks, and the
knobs that change it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from strata.cluster.nodes import POD_RUNTIME_LABEL
from strata.cluster.podruntime.env import quantity
from strata.cluster.podruntime.spec import Container, Pod


def _cpu(container: Container) -> float:
    request = container.resources.requests.get("cpu")
    return quantity(request) if request else 0.0


def pod_cpu(pod: Pod) -> float:
    """The CPU the scheduler counts for a pod: main containers and sidecars together, or the
    largest init container if that is more."""
    init = pod.spec.init_containers
    running = sum(_cpu(c) for c in pod.spec.containers) + sum(_cpu(c) for c in init if c.is_sidecar)
    return max([running, *(_cpu(c) for c in init if not c.is_sidecar)])


def wants_local(pod: Pod) -> bool:
    """The pod tolerates the local nodes' taint: it asked to run for real."""
    return any(
        t.key == POD_RUNTIME_LABEL or (not t.key and t.operator == "Exists") for t in pod.spec.tolerations
    )


def starved_of_cpu(conditions: Sequence[Mapping[str, Any]]) -> bool:
    for condition in conditions:
        if condition.get("type") == "PodScheduled" and condition.get("reason") == "Unschedulable":
            return "Insufficient cpu" in (condition.get("message") or "")
    return False


def shortage_message(
    pod: Pod, conditions: Sequence[Mapping[str, Any]], offered: float, taken: float, machine_cpus: int
) -> str | None:
    """Why ``pod`` stays Pending, or None when it is not a local pod short of CPU."""
    if not (wants_local(pod) and starved_of_cpu(conditions)):
        return None
    return (
        f"the local nodes offer {offered:g} CPU in all (this machine has {machine_cpus}); their pods "
        f"request {taken:g}, this pod {pod_cpu(pod):g}: it stays Pending until CPU frees up. Scale "
        "something down, lower the pod's CPU requests, or give local nodes more CPU "
        "(ClusterConfig.local_node_cpu, strata cluster up --local-node-cpu), knowing the machine is "
        "then oversubscribed."
    )


def requested(pods: Iterable[Pod]) -> float:
    return sum(pod_cpu(p) for p in pods)
