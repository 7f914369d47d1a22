"""The worker workload: a Deployment, or a StatefulSet when the NVMe tier must survive restarts.

A StatefulSet gives each replica a stable identity, so its claim (or its host directory)
follows it across restarts and the cold KV on NVMe is still there when it comes back."""

from __future__ import annotations

from strata.operator import names
from strata.operator.plan import ServicePlan
from strata.operator.render.common import Manifest, metadata
from strata.operator.render.pod import render_pod_template
from strata.operator.render.volumes import NVME_VOLUME, nvme_claim_spec, uses_claim_template
from strata.operator.settings import OperatorSettings

WORKLOAD_API_VERSION = "apps/v1"


def render_workload(plan: ServicePlan, settings: OperatorSettings) -> Manifest:
    if plan.workload_kind == "StatefulSet":
        return render_statefulset(plan, settings)
    return render_deployment(plan, settings)


def render_deployment(plan: ServicePlan, settings: OperatorSettings) -> Manifest:
    return {
        "apiVersion": WORKLOAD_API_VERSION,
        "kind": "Deployment",
        "metadata": metadata(plan, names.workload_name(plan.name), "worker"),
        "spec": {
            "replicas": plan.replicas,
            "selector": {"matchLabels": names.selector_labels(plan.name)},
            # Surge one replica rather than drop one: serving capacity never falls during a roll.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "revisionHistoryLimit": 3,
            "progressDeadlineSeconds": 1200,
            "template": render_pod_template(plan, settings),
        },
    }


def render_statefulset(plan: ServicePlan, settings: OperatorSettings) -> Manifest:
    spec: Manifest = {
        "replicas": plan.replicas,
        "serviceName": names.metrics_service_name(plan.name),
        "selector": {"matchLabels": names.selector_labels(plan.name)},
        "podManagementPolicy": "Parallel",
        "updateStrategy": {"type": "RollingUpdate"},
        "revisionHistoryLimit": 3,
        # The cache is worth keeping across a scale-down, not after the service is gone.
        "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Delete", "whenScaled": "Retain"},
        "template": render_pod_template(plan, settings),
    }
    if uses_claim_template(plan, settings):
        spec["volumeClaimTemplates"] = [
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": NVME_VOLUME, "labels": names.selector_labels(plan.name)},
                "spec": nvme_claim_spec(plan),
            }
        ]
    return {
        "apiVersion": WORKLOAD_API_VERSION,
        "kind": "StatefulSet",
        "metadata": metadata(plan, names.workload_name(plan.name), "worker"),
        "spec": spec,
    }
