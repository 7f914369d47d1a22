"""Smoke tests: the test control plane is a real one (scheduler, controllers, RBAC, admission)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from strata.cluster import Cluster, GpuNodeShape
from strata.cluster.nodes import GPU_PRODUCT_LABEL, GPU_RESOURCE, LOCAL_TAINT, POD_RUNTIME_LABEL
from tests.foundation.waiting import WAIT_S, eventually

pytestmark = pytest.mark.cluster

IMAGE = "registry.invalid/strata/noop:1"  # KWOK never pulls images


def deployment(name: str, replicas: int, gpus: int) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": IMAGE}
    if gpus:
        container["resources"] = {"limits": {GPU_RESOURCE: str(gpus)}}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [container]}},
        },
    }


def pods(cluster: Cluster, namespace: str, selector: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.kubectl_json("get", "pods", "-n", namespace, "-l", selector)[
        "items"
    ]
    return items


def is_ready(pod: dict[str, Any]) -> bool:
    conditions = pod["status"].get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def test_gpu_deployment_runs_on_fake_gpu_nodes(cluster: Cluster, namespace: str) -> None:
    cluster.apply(deployment("gpu-app", replicas=3, gpus=1), namespace)
    cluster.kubectl(
        "rollout",
        "status",
        "deployment/gpu-app",
        "-n",
        namespace,
        f"--timeout={WAIT_S:.0f}s",
        timeout_s=WAIT_S + 30,
    )

    running = pods(cluster, namespace, "app=gpu-app")
    assert len(running) == 3
    gpu_nodes = {
        n["metadata"]["name"] for n in cluster.kubectl_json("get", "nodes", "-l", GPU_PRODUCT_LABEL)["items"]
    }
    for pod in running:
        assert pod["status"]["phase"] == "Running"
        assert is_ready(pod)
        assert pod["spec"]["nodeName"] in gpu_nodes
        assert pod["spec"]["containers"][0]["resources"]["requests"][GPU_RESOURCE] == "1"


def test_pod_wanting_more_gpus_than_any_node_stays_pending(cluster: Cluster, namespace: str) -> None:
    nodes = cluster.kubectl_json("get", "nodes")["items"]
    most = max(int(n["status"]["allocatable"].get(GPU_RESOURCE, "0")) for n in nodes)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "too-big"},
        "spec": {
            "containers": [
                {"name": "main", "image": IMAGE, "resources": {"limits": {GPU_RESOURCE: str(most + 1)}}}
            ]
        },
    }
    cluster.apply(pod, namespace)

    def failed_scheduling() -> list[dict[str, Any]]:
        events = cluster.kubectl_json(
            "get",
            "events",
            "-n",
            namespace,
            "--field-selector",
            "involvedObject.name=too-big,reason=FailedScheduling",
        )["items"]
        return list(events)

    events = eventually(failed_scheduling, "a FailedScheduling event")
    assert f"Insufficient {GPU_RESOURCE}" in events[0]["message"]
    status = cluster.kubectl_json("get", "pod", "too-big", "-n", namespace)["status"]
    assert status["phase"] == "Pending"
    scheduled = next(c for c in status["conditions"] if c["type"] == "PodScheduled")
    assert (scheduled["status"], scheduled["reason"]) == ("False", "Unschedulable")


def test_deleting_a_deployment_garbage_collects_replicasets_and_pods(
    cluster: Cluster, namespace: str
) -> None:
    cluster.apply(deployment("doomed", replicas=2, gpus=1), namespace)
    cluster.kubectl(
        "rollout",
        "status",
        "deployment/doomed",
        "-n",
        namespace,
        f"--timeout={WAIT_S:.0f}s",
        timeout_s=WAIT_S + 30,
    )
    assert cluster.kubectl_json("get", "replicasets", "-n", namespace, "-l", "app=doomed")["items"]
    assert len(pods(cluster, namespace, "app=doomed")) == 2

    # Background cascade: the apiserver deletes only the Deployment; the garbage collector in
    # kube-controller-manager must delete the ReplicaSet, and KWOK must finish the pods' deletion.
    cluster.kubectl("delete", "deployment", "doomed", "-n", namespace, "--cascade=background", "--wait=false")

    def all_gone() -> bool:
        leftover = cluster.kubectl(
            "get", "replicasets,pods", "-n", namespace, "-l", "app=doomed", "-o", "name"
        ).stdout.split()
        return not leftover

    eventually(all_gone, "the ReplicaSet and pods to be garbage-collected")


def test_rbac_denies_a_user_without_permission_and_allows_one_with_a_rolebinding(
    cluster: Cluster, namespace: str
) -> None:
    stranger = cluster.user_kubeconfig("stranger")
    denied = cluster.kubectl("get", "pods", "-n", namespace, user_kubeconfig=stranger, check=False)
    assert denied.returncode != 0
    assert "Forbidden" in denied.stderr
    assert 'User "stranger" cannot list resource "pods"' in denied.stderr

    cluster.kubectl("create", "role", "pod-reader", "--verb=get,list", "--resource=pods", "-n", namespace)
    cluster.kubectl("create", "rolebinding", "reader", "--role=pod-reader", "--user=reader", "-n", namespace)
    reader = cluster.user_kubeconfig("reader")
    assert cluster.kubectl("get", "pods", "-n", namespace, user_kubeconfig=reader).returncode == 0
    # The grant is exactly what the Role says: reading pods, not creating them.
    create = cluster.kubectl(
        "run", "x", f"--image={IMAGE}", "-n", namespace, user_kubeconfig=reader, check=False
    )
    assert "Forbidden" in create.stderr


def test_group_membership_in_a_client_certificate_is_honoured(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl(
        "create", "rolebinding", "team", "--clusterrole=view", "--group=strata-team", "-n", namespace
    )
    member = cluster.user_kubeconfig("member", groups=["strata-team"])
    outsider = cluster.user_kubeconfig("member")
    assert cluster.kubectl("get", "configmaps", "-n", namespace, user_kubeconfig=member).returncode == 0
    assert (
        cluster.kubectl(
            "get", "configmaps", "-n", namespace, user_kubeconfig=outsider, check=False
        ).returncode
        != 0
    )


def test_service_account_kubeconfig_acts_as_that_service_account(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("create", "serviceaccount", "robot", "-n", namespace)
    robot = cluster.service_account_kubeconfig(namespace, "robot")
    whoami = json.loads(cluster.kubectl("auth", "whoami", "-o", "json", user_kubeconfig=robot).stdout)
    assert whoami["status"]["userInfo"]["username"] == f"system:serviceaccount:{namespace}:robot"
    assert (
        cluster.kubectl("get", "secrets", "-n", namespace, user_kubeconfig=robot, check=False).returncode != 0
    )


def test_validating_admission_policy_is_enforced(cluster: Cluster, namespace: str) -> None:
    policy = f"deny-unlabelled-{namespace}"
    manifest = f"""
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {{name: {policy}}}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
    - {{apiGroups: [""], apiVersions: [v1], operations: [CREATE], resources: [configmaps]}}
  validations:
  - expression: "has(object.metadata.labels) && 'owner' in object.metadata.labels"
    message: configmaps need an owner label
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {{name: {policy}}}
spec:
  policyName: {policy}
  validationActions: [Deny]
  matchResources:
    namespaceSelector:
      matchLabels: {{kubernetes.io/metadata.name: {namespace}}}
"""
    cluster.apply(manifest)
    try:
        # Policies take effect asynchronously (the admission plugin syncs from an informer).
        def denied() -> bool:
            result = cluster.kubectl("create", "configmap", "probe", "-n", namespace, check=False)
            if result.returncode == 0:
                cluster.kubectl("delete", "configmap", "probe", "-n", namespace)
            return "configmaps need an owner label" in result.stderr

        eventually(denied, "the ValidatingAdmissionPolicy to deny")
        labelled = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "ok", "labels": {"owner": "me"}},
        }
        cluster.apply(labelled, namespace)
    finally:
        cluster.kubectl(
            "delete", "validatingadmissionpolicybinding,validatingadmissionpolicy", policy, check=False
        )


def test_claims_are_provisioned_and_bound_and_their_volumes_deleted(cluster: Cluster, namespace: str) -> None:
    local_nvme = f"nvme-{namespace}"
    cluster.add_storage_class(local_nvme, binding_mode="WaitForFirstConsumer")
    try:
        shared_claim = {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "shared"},
            "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "10Gi"}}},
        }
        cluster.apply(shared_claim, namespace)  # no class: the default one, provisioned at once
        workload = deployment("cache", replicas=1, gpus=1)
        workload["kind"], workload["apiVersion"] = "StatefulSet", "apps/v1"
        pod_spec = workload["spec"]["template"]["spec"]
        pod_spec["containers"][0]["volumeMounts"] = [
            {"name": "nvme", "mountPath": "/nvme"},
            {"name": "shared", "mountPath": "/shared"},
        ]
        pod_spec["volumes"] = [{"name": "shared", "persistentVolumeClaim": {"claimName": "shared"}}]
        workload["spec"]["volumeClaimTemplates"] = [
            {
                "metadata": {"name": "nvme"},
                "spec": {
                    "storageClassName": local_nvme,
                    "accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": "100Gi"}},
                },
            }
        ]
        cluster.apply(workload, namespace)
        cluster.kubectl(
            "rollout",
            "status",
            "statefulset/cache",
            "-n",
            namespace,
            f"--timeout={WAIT_S:.0f}s",
            timeout_s=WAIT_S + 30,
        )

        claims = {
            c["metadata"]["name"]: c for c in cluster.kubectl_json("get", "pvc", "-n", namespace)["items"]
        }
        assert {name: c["status"]["phase"] for name, c in claims.items()} == {
            "shared": "Bound",
            "nvme-cache-0": "Bound",
        }
        assert claims["shared"]["spec"]["storageClassName"] == "standard"
        volumes = [claims[name]["spec"]["volumeName"] for name in ("shared", "nvme-cache-0")]

        cluster.kubectl("delete", "statefulset", "cache", "-n", namespace, "--wait=true", timeout_s=WAIT_S)
        cluster.kubectl("delete", "pvc", "--all", "-n", namespace, "--wait=false")

        def volumes_deleted() -> bool:
            names = cluster.kubectl("get", "pv", "-o", "name").stdout.split()
            return not {f"persistentvolume/{v}" for v in volumes} & set(names)

        eventually(volumes_deleted, "the provisioned volumes to be deleted")
    finally:
        cluster.kubectl("delete", "storageclass", local_nvme, "--ignore-not-found", check=False)


def test_fake_nodes_heartbeat_through_leases_and_stay_untainted(cluster: Cluster) -> None:
    # Without node Leases the node lifecycle controller taints every node unreachable (NoExecute)
    # about 50s after start, which evicts pods and blocks scheduling in longer test sessions.
    nodes = cluster.kubectl_json("get", "nodes", "-l", GPU_PRODUCT_LABEL)["items"]
    leases = {
        item["metadata"]["name"]
        for item in cluster.kubectl_json("get", "leases", "-n", "kube-node-lease")["items"]
    }
    assert any(n["metadata"]["labels"].get(POD_RUNTIME_LABEL) for n in nodes), "the local node's runtime too"
    for node in nodes:
        assert node["metadata"]["name"] in leases
        own = [LOCAL_TAINT] if node["metadata"]["labels"].get(POD_RUNTIME_LABEL) else []
        assert node["spec"].get("taints", []) == own


def test_add_gpu_nodes_creates_ready_nodes_with_the_requested_shape(cluster: Cluster) -> None:
    shape = GpuNodeShape(gpus=4, gpu_product="NVIDIA-A100-SXM4-40GB", gpu_memory_mib=40960, local_nvme_gib=0)
    names = cluster.add_gpu_nodes(2, shape, prefix="a100")
    try:
        assert names == ["a100-0", "a100-1"]
        for name in names:
            node = cluster.kubectl_json("get", "node", name)
            labels = node["metadata"]["labels"]
            assert labels[GPU_PRODUCT_LABEL] == "NVIDIA-A100-SXM4-40GB"
            assert labels["strata.dev/local-nvme"] == "false"
            assert labels["kubernetes.io/hostname"] == name
            assert node["status"]["allocatable"][GPU_RESOURCE] == "4"
        assert cluster.add_gpu_nodes(1, shape, prefix="a100") == ["a100-2"]
    finally:
        cluster.kubectl("delete", "nodes", "-l", f"{GPU_PRODUCT_LABEL}=NVIDIA-A100-SXM4-40GB", "--wait=false")
