"""The pod status the runtime writes back, built from the container records (pure).

Shaped like the kubelet's: phase, the four kubelet-owned conditions (their transition times kept
while their status holds), container and init-container statuses with state, lastState, ready,
started and restartCount, and the pod and host IPs.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from strata.cluster.podruntime import decide
from strata.cluster.podruntime.records import ContainerRecord, Exit
from strata.cluster.podruntime.spec import Container, Pod

KUBELET_CONDITIONS = ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready")


def container_statuses(status: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """A pod status's container statuses, init (native sidecars among them) and main, by name."""
    listed = [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]
    return {s["name"]: s for s in listed}


def timestamp(epoch: float) -> str:
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Addresses:
    pod_ip: str
    host_ip: str
    started_at: float


def _terminated(exit_: Exit, container_id: str) -> dict[str, Any]:
    state: dict[str, Any] = {
        "exitCode": exit_.code,
        "reason": exit_.reason,
        "startedAt": timestamp(exit_.started_at),
        "finishedAt": timestamp(exit_.finished_at),
        "containerID": container_id,
    }
    if exit_.message:
        state["message"] = exit_.message
    return {"terminated": state}


def _waiting(reason: str, message: str) -> dict[str, Any]:
    return {"waiting": {"reason": reason, **({"message": message} if message else {})}}


def _state(
    pod: Pod, container: Container, record: ContainerRecord, now: float
) -> tuple[dict[str, Any], Exit | None]:
    """(state, the exit shown as lastState)."""
    cid = container_id(pod, record)
    if record.running_since is not None:
        return {"running": {"startedAt": timestamp(record.running_since)}}, record.last_exit
    if record.waiting_reason and record.waiting_message:  # could not be created
        return _waiting(record.waiting_reason, record.waiting_message), record.exit
    if record.exit is None:
        reason = (
            "PodInitializing"
            if not container.is_sidecar and pod.spec.init_containers
            else "ContainerCreating"
        )
        return _waiting(record.waiting_reason or reason, ""), record.last_exit
    if decide.should_restart(pod.spec.restart_policy, container, record) and record.backoff_until > now:
        delay = record.backoff_until - (record.last_exit_at or record.backoff_until)
        meta = pod.metadata
        pod_name = f"{meta.name}_{meta.namespace}({meta.uid})"
        message = f"back-off {delay:.0f}s restarting failed container={container.name} pod={pod_name}"
        return _waiting("CrashLoopBackOff", message), record.exit
    return _terminated(record.exit, cid), record.last_exit


def container_id(pod: Pod, record: ContainerRecord) -> str:
    return f"strata://{pod.metadata.uid}/{record.name}/{record.starts}"


def container_status(pod: Pod, container: Container, record: ContainerRecord, now: float) -> dict[str, Any]:
    state, last = _state(pod, container, record, now)
    ready = record.ready
    if not container.is_sidecar and container in pod.spec.init_containers:
        ready = record.exit is not None and record.exit.code == 0
    status: dict[str, Any] = {
        "name": container.name,
        "image": container.image,
        "imageID": "",
        "ready": ready,
        "started": record.running and record.started,
        "restartCount": record.restarts,
        "state": state,
        "lastState": _terminated(last, container_id(pod, record)) if last is not None else {},
    }
    if record.starts:
        status["containerID"] = container_id(pod, record)
    return status


def _condition(type_: str, ok: bool, reason: str = "", message: str = "") -> dict[str, Any]:
    """A condition; a true one carries reason and message null, so the strategic-merge patch
    clears what an earlier false one said."""
    failing = not ok and reason
    return {
        "type": type_,
        "status": "True" if ok else "False",
        "reason": reason if failing else None,
        "message": message if failing else None,
    }


def _gates_pass(pod: Pod, existing: Sequence[dict[str, Any]]) -> bool:
    statuses = {c.get("type"): c.get("status") for c in existing}
    return all(statuses.get(gate.get("conditionType")) == "True" for gate in pod.spec.readiness_gates)


def _readiness(
    pod: Pod, unready: list[str], done: bool, existing: Sequence[dict[str, Any]]
) -> tuple[str, str]:
    """(reason, message) of a pod that is not ready; ("", "") when it is."""
    if done:
        return "PodCompleted", ""
    if unready:
        return "ContainersNotReady", f"containers with unready status: [{' '.join(unready)}]"
    if not _gates_pass(pod, existing):
        return "ReadinessGatesNotReady", "the pod's readiness gates are not all true"
    return "", ""


def conditions(
    pod: Pod, records: decide.Records, phase: str, existing: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The kubelet-owned conditions; ``existing`` (the pod's current ones) supplies readiness
    gates and the transition times of conditions whose status did not change."""
    pending = decide.incomplete_init(pod, records) if not decide.initialized(pod, records) else []
    unready = decide.unready(pod, records)
    done = phase in ("Succeeded", "Failed")
    reason, message = _readiness(pod, unready, done, existing)
    containers_reason = "ContainersNotReady" if unready else reason
    return [
        _condition("PodReadyToStartContainers", not done),
        _condition(
            "Initialized",
            not pending,
            "ContainersNotInitialized",
            f"containers with incomplete status: [{' '.join(pending)}]",
        ),
        _condition("ContainersReady", not unready and not done, containers_reason, message),
        _condition("Ready", not reason, reason, message),
    ]


def with_transition_times(
    fresh: list[dict[str, Any]], existing: Sequence[dict[str, Any]], now: float
) -> list[dict[str, Any]]:
    before = {c.get("type"): c for c in existing}
    out = []
    for condition in fresh:
        old = before.get(condition["type"])
        keep = old is not None and old.get("status") == condition["status"] and old.get("lastTransitionTime")
        out.append(
            {**condition, "lastTransitionTime": old["lastTransitionTime"] if keep and old else timestamp(now)}
        )
    return out


def pod_status(
    pod: Pod, records: decide.Records, addresses: Addresses, existing: Sequence[dict[str, Any]], now: float
) -> dict[str, Any]:
    """The ``status`` to patch onto the pod (a strategic merge: other writers' conditions stay)."""
    phase = decide.phase(pod, records)
    fresh = conditions(pod, records, phase, existing)
    return {
        "phase": phase,
        "conditions": with_transition_times(fresh, existing, now),
        "hostIP": addresses.host_ip,
        "hostIPs": [{"ip": addresses.host_ip}],
        "podIP": addresses.pod_ip,
        "podIPs": [{"ip": addresses.pod_ip}],
        "startTime": timestamp(addresses.started_at),
        "initContainerStatuses": [
            container_status(pod, c, records[c.name], now) for c in pod.spec.init_containers
        ],
        "containerStatuses": [container_status(pod, c, records[c.name], now) for c in pod.spec.containers],
    }
