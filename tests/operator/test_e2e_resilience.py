"""Killing the operator at any moment, and running two replicas: convergence, no duplicates,
no orphans, one active writer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from strata.cluster.cluster import Cluster
from strata.stack import OperatorProcess, get, inference_service, install_chart, items, wait_for, wait_ready
from strata.stack.chart import PEERING

pytestmark = pytest.mark.cluster

# The workers' and the router's: two Deployments (and ReplicaSets), two PDBs, the router's identity.
CHILD_KINDS = {
    "deployments": 2,
    "services": 2,
    "configmaps": 1,
    "poddisruptionbudgets": 2,
    "replicasets": 2,
    "serviceaccounts": 1,
    "roles": 1,
    "rolebindings": 1,
}


@pytest.fixture(scope="module")
def kubeconfig(cluster: Cluster) -> Path:
    return install_chart(cluster)


def assert_exactly_one_set_of_children(cluster: Cluster, namespace: str, names: list[str]) -> None:
    uids = {get(cluster, "inferenceservice", n, namespace)["metadata"]["uid"] for n in names}
    for kind, count in CHILD_KINDS.items():
        for name in names:
            found = items(cluster, kind, namespace, f"app.kubernetes.io/instance={name}")
            assert len(found) == count, f"{kind} of {name}: {[o['metadata']['name'] for o in found]}"
    # No orphans: everything the operator manages here is owned by a live InferenceService.
    for kind in ("deployments", "services", "configmaps", "poddisruptionbudgets", "roles", "rolebindings"):
        for obj in items(cluster, kind, namespace, "app.kubernetes.io/managed-by=strata-operator"):
            owners = {ref["uid"] for ref in obj["metadata"].get("ownerReferences", [])}
            assert owners & uids, f"orphan {kind}/{obj['metadata']['name']}"


def test_killed_mid_reconcile_converges_without_duplicates(
    cluster: Cluster, namespace: str, kubeconfig: Path, tmp_path: Path
):
    names = [f"svc-{i}" for i in range(6)]
    first = OperatorProcess(kubeconfig, tmp_path / "first.log").start()
    try:
        cluster.apply(
            {"apiVersion": "v1", "kind": "List", "items": [inference_service(n) for n in names]}, namespace
        )
        # Kill it as soon as it has started writing children: some services are half done.
        wait_for(
            lambda: items(cluster, "configmaps", namespace, "app.kubernetes.io/managed-by=strata-operator"),
            60,
            "the first child written",
            interval_s=0.05,
        )
    finally:
        first.kill()
    second = OperatorProcess(kubeconfig, tmp_path / "second.log").start()
    try:
        for name in names:
            wait_ready(cluster, namespace, name)
        assert_exactly_one_set_of_children(cluster, namespace, names)
    finally:
        second.stop()


def reconciles(process: OperatorProcess) -> float:
    return process.metric("strata_operator_reconciles_total")


def others_services(cluster: Cluster, namespace: str) -> list[str]:
    found = cluster.kubectl_json("get", "inferenceservices", "--all-namespaces", "-o", "json")["items"]
    return [o["metadata"]["namespace"] for o in found if o["metadata"]["namespace"] != namespace]


def test_two_replicas_one_active_and_a_standby_takes_over(
    cluster: Cluster, namespace: str, kubeconfig: Path, tmp_path: Path
):
    def start(name: str, priority: int) -> OperatorProcess:
        args = [f"--peering={PEERING}", f"--priority={priority}"]
        return OperatorProcess(kubeconfig, tmp_path / f"{name}.log", args=args, peering_lifetime_s=8).start()

    # Services of earlier tests whose namespaces are still being finalized would be reconciled
    # by "low" while it is alone, and those reconciles can end after it paused.
    wait_for(lambda: not others_services(cluster, namespace), 300, "earlier tests' services gone")
    low = start("low", 100)
    high = start("high", 200)
    try:
        # Alone, "low" was active; once it sees "high" it stands by and stops writing.
        wait_for(lambda: "Pausing operations in favour of" in low.log.read_text(), 30, "low to pause")
        low_before, high_before = reconciles(low), reconciles(high)
        cluster.apply(inference_service("one"), namespace)
        wait_ready(cluster, namespace, "one")
        assert reconciles(high) > high_before and reconciles(low) == low_before, "one active writer only"
        peering: dict[str, Any] = get(cluster, "clusterkopfpeering", PEERING)
        assert len(peering.get("status", {})) >= 2

        high.kill()  # no goodbye: its peering record must expire first
        cluster.apply(inference_service("two"), namespace)
        wait_ready(cluster, namespace, "two", timeout_s=120)
        assert reconciles(low) > low_before
        assert_exactly_one_set_of_children(cluster, namespace, ["one", "two"])
    finally:
        for process in (low, high):
            process.stop()
