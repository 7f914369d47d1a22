"""compute_status: conditions and counts from what one reconcile observed."""

from __future__ import annotations

from datetime import UTC, datetime

from strata.operator.status import Observed, compute_status, rollout, status_changed

T0 = datetime(2026, 1, 1, tzinfo=UTC)
T1 = datetime(2026, 1, 2, tzinfo=UTC)


def deployment(replicas=2, ready=2, updated=2, generation=3, observed=3, conditions=()):
    return {
        "metadata": {"generation": generation},
        "spec": {"replicas": replicas},
        "status": {
            "replicas": replicas,
            "readyReplicas": ready,
            "updatedReplicas": updated,
            "observedGeneration": observed,
            "conditions": list(conditions),
        },
    }


def seen(workload, **kw):
    base = dict(
        name="chat",
        generation=5,
        tier="standard",
        min_replicas=1,
        desired_replicas=2,
        endpoint="http://chat.team-a.svc:8000",
        workload=workload,
    )
    base.update(kw)
    return Observed(**base)


def conditions(status):
    return {c["type"]: c for c in status["conditions"]}


def test_ready_when_minimum_is_ready_and_rollout_complete():
    status = compute_status(seen(deployment()), [], T0)
    conds = conditions(status)
    assert conds["Ready"]["status"] == "True" and conds["Accepted"]["status"] == "True"
    assert conds["Progressing"]["status"] == "False" and conds["Degraded"]["status"] == "False"
    assert (
        status["readyReplicas"] == 2 and status["desiredReplicas"] == 2 and status["observedGeneration"] == 5
    )
    assert status["selector"] == "app.kubernetes.io/instance=chat,app.kubernetes.io/name=strata-worker"
    assert all(c["observedGeneration"] == 5 for c in status["conditions"])


def test_ready_but_progressing_while_rolling():
    conds = conditions(compute_status(seen(deployment(ready=1, updated=1)), [], T0))
    assert conds["Ready"]["status"] == "True" and conds["Progressing"]["status"] == "True"


def test_not_ready_below_minimum():
    conds = conditions(compute_status(seen(deployment(ready=0), min_replicas=1), [], T0))
    assert conds["Ready"]["status"] == "False" and conds["Ready"]["reason"] == "MinimumReplicasUnavailable"


def test_stale_workload_generation_is_progressing():
    assert not rollout(deployment(generation=4, observed=3)).done


def test_rejected_spec_with_running_workload_is_degraded_not_destroyed():
    status = compute_status(
        seen(
            deployment(),
            rejected=("TierNotFound", "spec.tier: ServiceTier 'gold' does not exist"),
            desired_replicas=None,
        ),
        [],
        T0,
    )
    conds = conditions(status)
    assert conds["Accepted"]["status"] == "False" and conds["Accepted"]["reason"] == "TierNotFound"
    assert "spec.tier" in conds["Accepted"]["message"]
    assert conds["Degraded"]["status"] == "True" and conds["Ready"]["status"] == "True"
    assert status["desiredReplicas"] == 2  # the running workload's own


def test_rejected_spec_without_workload_is_not_ready():
    conds = conditions(compute_status(seen(None, rejected=("TierLimitsExceeded", "x")), [], T0))
    assert conds["Ready"]["status"] == "False" and conds["Ready"]["reason"] == "TierLimitsExceeded"


def test_replica_failure_and_api_errors_degrade():
    failing = deployment(
        conditions=[
            {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate", "message": "forbidden"}
        ]
    )
    assert conditions(compute_status(seen(failing), [], T0))["Degraded"]["reason"] == "WorkloadFailure"
    assert conditions(compute_status(seen(deployment(), error="500"), [], T0))["Degraded"]["status"] == "True"


def test_transition_time_moves_only_when_status_changes():
    first = compute_status(seen(deployment()), [], T0)
    again = compute_status(seen(deployment()), first["conditions"], T1)
    assert again == first
    assert not status_changed(first, again)
    flipped = compute_status(seen(deployment(ready=0)), first["conditions"], T1)
    ready = conditions(flipped)["Ready"]
    assert ready["lastTransitionTime"] == "2026-01-02T00:00:00Z"
    assert conditions(flipped)["Accepted"]["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    assert status_changed(first, flipped)


def test_status_ignores_fields_the_autoscaler_owns():
    status = compute_status(seen(deployment()), [], T0)
    assert not status_changed({**status, "signals": {"kvCacheUsage": 0.5}}, status)
