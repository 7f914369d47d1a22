"""InferenceService status from observed state: a pure function of what the reconcile saw.

Only the fields the reconciler owns are computed here; ``signals`` and ``lastScaling`` belong
to the autoscaler and are never touched."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from strata.operator import names
from strata.operator.api import ACCEPTED, DEGRADED, PROGRESSING, READY

Status = dict[str, Any]
OWNED_FIELDS = (
    "observedGeneration",
    "conditions",
    "replicas",
    "readyReplicas",
    "desiredReplicas",
    "selector",
    "endpoint",
    "tier",
)


@dataclass(frozen=True)
class Observed:
    """What one reconcile saw and decided, in plain values."""

    name: str
    generation: int
    tier: str
    min_replicas: int
    desired_replicas: int | None  # None when the spec was rejected: the workload keeps its own
    endpoint: str | None
    workload: Mapping[str, Any] | None
    rejected: tuple[str, str] | None = None  # (reason, message) when the spec cannot be applied
    error: str | None = None  # a failed API call during this reconcile


@dataclass(frozen=True)
class Rollout:
    replicas: int
    ready: int
    desired: int
    done: bool
    failure: str | None


def rollout(workload: Mapping[str, Any] | None) -> Rollout:
    if workload is None:
        return Rollout(0, 0, 0, False, None)
    spec, status = workload.get("spec", {}), workload.get("status", {}) or {}
    desired = int(spec.get("replicas", 1))
    replicas, ready = int(status.get("replicas", 0)), int(status.get("readyReplicas", 0))
    updated = int(status.get("updatedReplicas", 0))
    observed = int(status.get("observedGeneration", 0)) >= int(
        workload.get("metadata", {}).get("generation", 0)
    )
    revisions_match = status.get("currentRevision", "") == status.get("updateRevision", "")
    done = observed and updated == desired and replicas == desired and ready >= desired and revisions_match
    return Rollout(replicas, ready, desired, done, _failure(status))


def _failure(status: Mapping[str, Any]) -> str | None:
    for cond in status.get("conditions", []) or []:
        if cond.get("type") == "ReplicaFailure" and cond.get("status") == "True":
            return f"{cond.get('reason', 'ReplicaFailure')}: {cond.get('message', '')}"
        if cond.get("type") == "Progressing" and cond.get("reason") == "ProgressDeadlineExceeded":
            return f"ProgressDeadlineExceeded: {cond.get('message', '')}"
    return None


def compute_status(seen: Observed, previous: Sequence[Mapping[str, Any]], now: datetime) -> Status:
    roll = rollout(seen.workload)
    conditions = [
        _accepted(seen),
        _ready(seen, roll),
        _progressing(seen, roll),
        _degraded(seen, roll),
    ]
    stamped = [stamp_condition(c, seen.generation, previous, now) for c in conditions]
    status: Status = {
        "observedGeneration": seen.generation,
        "conditions": stamped,
        "replicas": roll.replicas,
        "readyReplicas": roll.ready,
        "desiredReplicas": seen.desired_replicas if seen.desired_replicas is not None else roll.desired,
        "selector": names.label_selector(names.selector_labels(seen.name)),
        "tier": seen.tier,
    }
    if seen.endpoint:
        status["endpoint"] = seen.endpoint
    return status


def _cond(type_: str, ok: bool, reason: str, message: str) -> dict[str, Any]:
    return {"type": type_, "status": "True" if ok else "False", "reason": reason, "message": message}


def _accepted(seen: Observed) -> dict[str, Any]:
    if seen.rejected is not None:
        reason, message = seen.rejected
        return _cond(ACCEPTED, False, reason, message)
    return _cond(ACCEPTED, True, "Accepted", f"spec fits ServiceTier {seen.tier}")


def _ready(seen: Observed, roll: Rollout) -> dict[str, Any]:
    if seen.workload is None:
        reason = seen.rejected[0] if seen.rejected else "WorkloadMissing"
        return _cond(READY, False, reason, "no worker workload exists")
    ok = roll.ready >= seen.min_replicas
    reason = "MinimumReplicasReady" if ok else "MinimumReplicasUnavailable"
    return _cond(READY, ok, reason, f"{roll.ready} of minimum {seen.min_replicas} replicas ready")


def _progressing(seen: Observed, roll: Rollout) -> dict[str, Any]:
    if seen.rejected is not None:
        return _cond(
            PROGRESSING, False, "SpecRejected", "the spec is not applied; see the Accepted condition"
        )
    if roll.done:
        return _cond(
            PROGRESSING, False, "Complete", f"{roll.ready}/{roll.desired} replicas up to date and ready"
        )
    return _cond(PROGRESSING, True, "RollingOut", f"{roll.ready}/{roll.desired} replicas ready")


def _degraded(seen: Observed, roll: Rollout) -> dict[str, Any]:
    if seen.error is not None:
        return _cond(DEGRADED, True, "ReconcileError", seen.error)
    if seen.rejected is not None and seen.workload is not None:
        return _cond(
            DEGRADED, True, "RunningLastAcceptedSpec", "the new spec is rejected; pods keep the last one"
        )
    if roll.failure is not None:
        return _cond(DEGRADED, True, "WorkloadFailure", roll.failure)
    return _cond(DEGRADED, False, "AsExpected", "")


def stamp_condition(
    cond: dict[str, Any], generation: int, previous: Sequence[Mapping[str, Any]], now: datetime
) -> dict[str, Any]:
    before = next((p for p in previous if p.get("type") == cond["type"]), None)
    same = before is not None and before.get("status") == cond["status"]
    stamp = before.get("lastTransitionTime") if same and before else None
    return {**cond, "observedGeneration": generation, "lastTransitionTime": stamp or _rfc3339(now)}


def _rfc3339(now: datetime) -> str:
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")


def status_changed(current: Mapping[str, Any] | None, new: Status) -> bool:
    current = current or {}
    return any(current.get(key) != new.get(key) for key in OWNED_FIELDS)
