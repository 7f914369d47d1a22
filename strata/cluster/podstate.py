"""Whether a pod is on its way to Ready, Ready, or stuck: a pure reading of its status.

Every wait on a pod asks this, so a pod that cannot become Ready by waiting (a container that
cannot start, crash-loops, has no image, an init container that failed, a failed pod) ends the
wait at once with the reason, instead of after the wait's bound.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

# Waiting reasons that waiting does not cure: the kubelet's (and the local runtime's) names.
STUCK_WAITING = frozenset(
    {
        "CrashLoopBackOff",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
        "ImagePullBackOff",
        "ErrImagePull",
        "ErrImageNeverPull",
        "InvalidImageName",
    }
)
# Exit codes of a container killed from outside (SIGKILL, SIGTERM): a fault test or an eviction,
# after which the restart is expected; its CrashLoopBackOff is the back-off, not a broken spec.
KILLED_EXITS = frozenset({137, 143})
# A container whose process could not be started (command not found, bad working directory).
START_ERROR = "StartError"

Phase = Literal["progressing", "ready", "stuck"]


@dataclass(frozen=True)
class PodState:
    phase: Phase
    container: str = ""  # the container that is stuck, when one is
    reason: str = ""

    def describe(self, pod_name: str) -> str:
        where = f"pod {pod_name}" + (f", container {self.container}" if self.container else "")
        return f"{where}: {self.reason}"


def _entries(pod: Mapping[str, Any]) -> list[tuple[bool, dict[str, Any]]]:
    """(runs to completion before the others, status) of every container, init containers first;
    a native sidecar (an init container that restarts) counts as a main container."""
    status = pod.get("status") or {}
    specs = (pod.get("spec") or {}).get("initContainers") or []
    sidecars = {c.get("name") for c in specs if c.get("restartPolicy") == "Always"}
    inits = [(e.get("name") not in sidecars, dict(e)) for e in status.get("initContainerStatuses") or []]
    return [*inits, *((False, dict(e)) for e in status.get("containerStatuses") or [])]


def _terminated_text(done: Mapping[str, Any]) -> str:
    text = f"{done.get('reason') or 'Error'} (exit code {done.get('exitCode')})"
    return f"{text}: {done['message']}" if done.get("message") else text


def _killed(entry: Mapping[str, Any]) -> bool:
    last = (entry.get("lastState") or {}).get("terminated") or {}
    return last.get("exitCode") in KILLED_EXITS and last.get("reason") != "OOMKilled"


def container_stuck(entry: Mapping[str, Any], init: bool) -> str | None:
    """Why this container cannot start by waiting; None while it may."""
    state = entry.get("state") or {}
    waiting, done = state.get("waiting") or {}, state.get("terminated") or {}
    if waiting.get("reason") in STUCK_WAITING and not (
        waiting["reason"] == "CrashLoopBackOff" and _killed(entry)
    ):
        last = (entry.get("lastState") or {}).get("terminated")
        cause = f"; last run: {_terminated_text(last)}" if last else ""
        return f"{waiting['reason']}: {waiting.get('message', '')}{cause}"
    if done.get("reason") == START_ERROR:
        return _terminated_text(done)
    if init and done and done.get("exitCode", 0) != 0:
        return f"init container failed: {_terminated_text(done)}"
    return None


def ready_condition(status: Mapping[str, Any]) -> bool:
    """Whether a pod's status carries Ready=True."""
    conditions = status.get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def classify(pod: Mapping[str, Any]) -> PodState:
    """Where ``pod`` stands: ready, stuck (naming the container and why) or progressing."""
    status = pod.get("status") or {}
    if status.get("phase") in ("Failed", "Succeeded"):
        why = status.get("reason") or status.get("message") or "its containers have finished"
        return PodState("stuck", reason=f"pod phase {status['phase']}: {why}")
    for init, entry in _entries(pod):
        if (why := container_stuck(entry, init)) is not None:
            return PodState("stuck", entry.get("name", ""), why)
    return PodState("ready") if ready_condition(status) else PodState("progressing")
