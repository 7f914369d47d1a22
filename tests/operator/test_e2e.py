"""The operator end to end on the real control plane with KWOK GPU nodes, as the chart's
ServiceAccount: create, update, tier change, drift repair, rejected specs, delete."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from strata.cluster.cluster import Cluster
from strata.stack import (
    NVME_HOST_PATH,
    OperatorProcess,
    condition,
    events,
    get,
    inference_service,
    items,
    operator_running,
    running_pods,
    wait_for,
    wait_ready,
)

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def operator(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    with operator_running(cluster, tmp_path_factory.mktemp("operator") / "operator.log") as process:
        yield process


@pytest.fixture
def tier(cluster: Cluster) -> Iterator[str]:
    """A ServiceTier of this test's own, so tier edits cannot disturb other tests."""
    name = f"e2e-{uuid.uuid4().hex[:6]}"
    cluster.apply(tier_manifest(name, priority=50000, dram_max="4Gi", write_mode="write-back"))
    try:
        yield name
    finally:
        cluster.kubectl("delete", "servicetier", name, "--ignore-not-found", "--wait=false", check=False)


def tier_manifest(
    name: str, priority: int, dram_max: str, write_mode: str, survives_restart: bool = False
) -> dict[str, Any]:
    return {
        "apiVersion": "strata.dev/v1alpha1",
        "kind": "ServiceTier",
        "metadata": {"name": name},
        "spec": {
            "priority": priority,
            "cache": {
                "dram": {"defaultSize": "1Gi", "maxSize": dram_max},
                "nvme": {"defaultSize": "10Gi", "maxSize": "100Gi", "survivesRestart": survives_restart},
                "writeMode": write_mode,
            },
            "autoscaling": {"minReplicas": 1, "maxReplicas": 4},
        },
    }


def create(cluster: Cluster, namespace: str, name: str, tier: str = "standard", **spec) -> dict[str, Any]:
    cluster.apply(inference_service(name, tier, **spec), namespace)
    return wait_ready(cluster, namespace, name)


def worker_yaml(cluster: Cluster, namespace: str, name: str) -> str:
    cm = get(cluster, "configmap", f"{name}-config", namespace)
    assert cm is not None
    return str(cm["data"]["worker.yaml"])


def test_create_runs_hardened_gpu_pods_with_the_kv_sidecar(cluster: Cluster, namespace: str, operator):
    isvc = create(cluster, namespace, "chat")
    assert isvc["status"]["endpoint"] == f"http://chat.{namespace}.svc:8000"
    assert isvc["status"]["readyReplicas"] == 1 and isvc["status"]["observedGeneration"] == 1
    (pod,) = running_pods(cluster, namespace, "chat")
    spec = pod["spec"]
    assert spec["nodeName"].startswith("gpu-node-")
    assert spec["priorityClassName"] == "strata-standard" and spec["priority"] == 100000
    engine = spec["containers"][0]
    assert engine["resources"]["requests"]["nvidia.com/gpu"] == "1"
    assert engine["resources"]["limits"]["nvidia.com/gpu"] == "1"
    sidecar = next(c for c in spec["initContainers"] if c["name"] == "kvtier")
    assert sidecar["restartPolicy"] == "Always"
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["shm"]["emptyDir"] == {
        "medium": "Memory",
        "sizeLimit": "1536Mi",
    }  # 1Gi + 256Mi staging + 256Mi
    assert volumes["nvme"]["hostPath"]["path"] == NVME_HOST_PATH
    assert spec["securityContext"]["runAsNonRoot"] and spec["securityContext"]["seccompProfile"]["type"] == (
        "RuntimeDefault"
    )
    for c in spec["containers"] + spec["initContainers"]:
        assert c["securityContext"]["readOnlyRootFilesystem"] and c["securityContext"]["capabilities"] == {
            "drop": ["ALL"]
        }
    assert spec["nodeSelector"]["strata.dev/local-nvme"] == "true"
    # The rendered config carries this tenant's cache namespace: <namespace>.<namespace uid>.
    ns_uid = cluster.kubectl_json("get", "namespace", namespace)["metadata"]["uid"]
    assert f"cache_namespace: {namespace}.{ns_uid}" in worker_yaml(cluster, namespace, "chat")
    for kind, name in (("service", "chat"), ("service", "chat-metrics"), ("pdb", "chat")):
        assert get(cluster, kind, name, namespace) is not None
    assert {"Created", "Ready"} <= {e["reason"] for e in events(cluster, namespace, "chat")}
    assert operator.metric("strata_operator_reconciles_total") > 0
    assert operator.metric("strata_operator_managed_services") >= 1


def test_spec_change_rolls_the_pods(cluster: Cluster, namespace: str, operator):
    create(cluster, namespace, "roll")
    (old,) = running_pods(cluster, namespace, "roll")
    cluster.kubectl(
        "patch",
        "inferenceservice",
        "roll",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"cache": {"dram": "2Gi"}, "resources": {"memory": "6Gi"}}}),
    )

    def rolled() -> list[dict[str, Any]] | None:
        pods = running_pods(cluster, namespace, "roll")
        fresh = [p for p in pods if p["metadata"]["uid"] != old["metadata"]["uid"]]
        return fresh if len(pods) == 1 and fresh else None

    (new,) = wait_for(rolled, 90, "pods rolled to the new spec")
    assert (
        new["metadata"]["annotations"]["strata.dev/config-hash"]
        != (old["metadata"]["annotations"]["strata.dev/config-hash"])
    )
    assert new["spec"]["containers"][0]["resources"]["limits"]["memory"] == "6Gi"
    assert "capacity_bytes: 2147483648" in worker_yaml(cluster, namespace, "roll")
    isvc = wait_ready(cluster, namespace, "roll")
    wait_for(
        lambda: (
            (get(cluster, "inferenceservice", "roll", namespace) or {})
            .get("status", {})
            .get("observedGeneration")
            == 2
        ),
        30,
        "observedGeneration 2",
    )
    assert isvc["metadata"]["generation"] == 2


def test_tier_change_rerenders_every_service_of_the_tier(cluster: Cluster, namespace: str, operator, tier):
    create(cluster, namespace, "a", tier)
    create(cluster, namespace, "b", tier)
    old = {p["metadata"]["uid"] for s in ("a", "b") for p in running_pods(cluster, namespace, s)}
    cluster.apply(tier_manifest(tier, priority=7000, dram_max="4Gi", write_mode="write-through"))

    def rerendered() -> bool:
        return all("write-through" in worker_yaml(cluster, namespace, n) for n in ("a", "b"))

    wait_for(rerendered, 60, "both services re-rendered")

    def new_pods() -> list[dict[str, Any]] | None:
        pods = [p for s in ("a", "b") for p in running_pods(cluster, namespace, s)]
        return pods if len(pods) == 2 and not old & {p["metadata"]["uid"] for p in pods} else None

    pods = wait_for(new_pods, 90, "pods of both services rolled")
    # A PriorityClass's value is immutable: the operator re-created it with the new priority.
    assert get(cluster, "priorityclass", f"strata-{tier}")["value"] == 7000
    assert {p["spec"]["priority"] for p in pods} == {7000}


def test_nvme_that_survives_restarts_switches_to_a_statefulset(
    cluster: Cluster, namespace: str, operator, tier
):
    create(cluster, namespace, "keepcache", tier)
    assert get(cluster, "deployment", "keepcache", namespace) is not None
    cluster.apply(
        tier_manifest(tier, priority=50000, dram_max="4Gi", write_mode="write-back", survives_restart=True)
    )

    def switched() -> bool:
        return (
            get(cluster, "deployment", "keepcache", namespace) is None
            and get(cluster, "statefulset", "keepcache", namespace) is not None
            and [p["metadata"]["name"] for p in running_pods(cluster, namespace, "keepcache")]
            == ["keepcache-0"]
        )

    wait_for(switched, 90, "Deployment replaced by a StatefulSet")
    assert "persistent: true" in worker_yaml(cluster, namespace, "keepcache")
    assert "Replaced" in {e["reason"] for e in events(cluster, namespace, "keepcache")}
    wait_ready(cluster, namespace, "keepcache")


def test_deleted_and_hand_edited_children_are_repaired(cluster: Cluster, namespace: str, operator):
    create(cluster, namespace, "drift")
    deployment = get(cluster, "deployment", "drift", namespace)
    cluster.kubectl("delete", "configmap", "drift-config", "-n", namespace)
    cluster.kubectl("delete", "service", "drift-metrics", "-n", namespace)
    cluster.kubectl(
        "patch",
        "deployment",
        "drift",
        "-n",
        namespace,
        "--type=json",
        "-p",
        json.dumps(
            [
                {"op": "replace", "path": "/spec/template/spec/containers/0/image", "value": "evil:1"},
                {"op": "replace", "path": "/spec/replicas", "value": 3},
            ]
        ),
    )

    def repaired() -> bool:
        d = get(cluster, "deployment", "drift", namespace) or {}
        image = d.get("spec", {}).get("template", {}).get("spec", {}).get("containers", [{}])[0].get("image")
        return (
            image == "ghcr.io/strata-dev/strata-worker:0.1.0"
            and d["spec"]["replicas"] == 1
            and get(cluster, "configmap", "drift-config", namespace) is not None
            and get(cluster, "service", "drift-metrics", namespace) is not None
        )

    wait_for(repaired, 60, "children repaired")
    assert get(cluster, "deployment", "drift", namespace)["metadata"]["uid"] == deployment["metadata"]["uid"]
    wait_ready(cluster, namespace, "drift")


def test_missing_or_tightened_tier_leaves_the_workload_alone(
    cluster: Cluster, namespace: str, operator, tier
):
    create(cluster, namespace, "keep", tier, cache={"dram": "3Gi", "nvme": "10Gi"})
    before = get(cluster, "deployment", "keep", namespace)
    (pod,) = running_pods(cluster, namespace, "keep")

    # The tier is tightened below what the service asks for: rejected, nothing touched.
    cluster.apply(tier_manifest(tier, priority=50000, dram_max="2Gi", write_mode="write-back"))
    rejected = wait_for(
        lambda: (
            condition(get(cluster, "inferenceservice", "keep", namespace), "Accepted").get("reason")
            == "TierLimitsExceeded"
        ),
        60,
        "Accepted=False TierLimitsExceeded",
    )
    assert rejected
    accepted = condition(get(cluster, "inferenceservice", "keep", namespace), "Accepted")
    assert accepted["status"] == "False" and "spec.cache.dram" in accepted["message"]

    # The tier disappears: a different reason, still nothing destroyed.
    cluster.kubectl("delete", "servicetier", tier)
    wait_for(
        lambda: (
            condition(get(cluster, "inferenceservice", "keep", namespace), "Accepted").get("reason")
            == "TierNotFound"
        ),
        60,
        "Accepted=False TierNotFound",
    )
    isvc = get(cluster, "inferenceservice", "keep", namespace)
    assert condition(isvc, "Degraded")["status"] == "True" and condition(isvc, "Ready")["status"] == "True"
    warnings = {e["reason"] for e in events(cluster, namespace, "keep") if e["type"] == "Warning"}
    assert {"TierLimitsExceeded", "TierNotFound"} <= warnings
    after = get(cluster, "deployment", "keep", namespace)
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert after["metadata"]["generation"] == before["metadata"]["generation"]
    assert [p["metadata"]["uid"] for p in running_pods(cluster, namespace, "keep")] == [
        pod["metadata"]["uid"]
    ]


def test_delete_garbage_collects_everything(cluster: Cluster, namespace: str, operator):
    create(cluster, namespace, "gone")
    cluster.kubectl("delete", "inferenceservice", "gone", "-n", namespace, "--wait=false")
    selector = "app.kubernetes.io/instance=gone"

    def all_gone() -> bool:
        kinds = ("deployments", "replicasets", "pods", "services", "configmaps", "poddisruptionbudgets")
        return all(not items(cluster, kind, namespace, selector) for kind in kinds)

    wait_for(all_gone, 90, "children garbage-collected")
    assert get(cluster, "inferenceservice", "gone", namespace) is None


def test_operator_log_is_structured(operator):
    lines = [line for line in Path(operator.log).read_text().splitlines() if line.startswith("{")]
    assert lines and all("message" in json.loads(line) for line in lines)
