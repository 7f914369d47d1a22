"""The router's objects on the real control plane: the operator (as the chart's ServiceAccount)
renders them, and the router's own ServiceAccount can list and watch the service's worker Pods and
nothing else. (The fake nodes' pods have no reachable IP: nothing here connects to a pod.)"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from strata.cluster.cluster import Cluster
from strata.operator import names
from strata.router.config import RouterConfig
from strata.router.discovery import pod_state
from strata.router.kube import KubeError, PodReader, from_kubeconfig
from strata.stack import OperatorProcess, get, inference_service, operator_running, wait_ready

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def operator(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    with operator_running(cluster, tmp_path_factory.mktemp("operator") / "operator.log") as process:
        yield process


def router_config(cluster: Cluster, namespace: str, name: str) -> RouterConfig:
    cm = get(cluster, "configmap", names.configmap_name(name), namespace)
    assert cm is not None
    return RouterConfig.from_yaml(cm["data"][names.ROUTER_CONFIG_FILE])


def test_the_operator_renders_the_router_with_a_pod_reading_identity(
    cluster: Cluster, namespace: str, operator: OperatorProcess
):
    cluster.apply(inference_service("chat", replicas=2, maxReplicas=2), namespace)
    wait_ready(cluster, namespace, "chat")
    router = names.router_name("chat")
    deployment = get(cluster, "deployment", router, namespace)
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == router
    for kind in ("serviceaccount", "role", "rolebinding", "poddisruptionbudget"):
        assert get(cluster, kind, router, namespace) is not None, kind
    service = get(cluster, "service", "chat", namespace)
    assert service["spec"]["selector"] == names.router_selector_labels("chat")
    config = router_config(cluster, namespace, "chat")
    assert config.workers.label_selector == names.label_selector(names.selector_labels("chat"))

    creds = from_kubeconfig(cluster.service_account_kubeconfig(namespace, router))
    assert asyncio.run(_discovered(creds, namespace, config)) == 2
    denied = cluster.kubectl(
        "auth",
        "can-i",
        "list",
        "configmaps",
        "-n",
        namespace,
        f"--as=system:serviceaccount:{namespace}:{router}",
        check=False,
    )
    assert denied.stdout.strip() == "no"
    assert (
        cluster.kubectl(
            "auth",
            "can-i",
            "watch",
            "pods",
            "-n",
            namespace,
            f"--as=system:serviceaccount:{namespace}:{router}",
        ).stdout.strip()
        == "yes"
    )


async def _discovered(creds: Any, namespace: str, config: RouterConfig) -> int:
    """The worker pods the router's own account lists, and a watch that sees them too."""
    reader = PodReader(creds, namespace, config.workers.label_selector)
    try:
        pods, version = await reader.list()
        states = [s for p in pods if (s := pod_state(p, config.workers))]
        seen = 0
        async with asyncio.timeout(60):
            async for event in reader.watch("0"):  # from the start: the existing pods as ADDED
                if event.get("type") == "ADDED":
                    seen += 1
                if seen == len(pods):
                    break
        assert version and seen == len(pods)
        forbidden = PodReader(creds, "kube-system", "")
        with pytest.raises(KubeError) as denied:
            await forbidden.list()
        assert denied.value.status == 403
        await forbidden.close()
        return len([s for s in states if s.ready])
    finally:
        await reader.close()
