"""The operator's worker pods running for real on the session cluster's local node.

The operator (as the chart's ServiceAccount) renders the pod; the local pod runtime runs its
model-fetch init container, the KV-tier native sidecar and the torch engine (``tiny`` model, one
thread, on the CPU) as processes that listen on the pod IP. A client reaches the engine there
with the official ``openai`` client, and the operator's autoscaler scrapes it there too.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from strata.cluster import Cluster
from strata.common.endpoints import WORKER_PORT
from strata.stack import (
    OperatorProcess,
    get,
    inference_service,
    local_pods_env,
    local_resources,
    operator_running,
    running_pods,
    wait_for,
    wait_ready,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
# Importing torch and loading the model on a loaded two-core machine takes minutes, not seconds.
READY_S = 900.0


@pytest.fixture(scope="module")
def operator(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    directory = tmp_path_factory.mktemp("operator-local")
    env = {**local_pods_env(directory / "nvme"), "STRATA_AUTOSCALE_INTERVAL_S": "2"}
    with operator_running(cluster, directory / "operator.log", env=env) as process:
        yield process


def local_service(name: str) -> dict[str, Any]:
    """One replica on the local node: no GPU (the engine runs on the CPU), one CPU, small tiers."""
    spec = {"replicas": 1, "resources": local_resources("1", "2Gi"), "cache": {"dram": "64Mi", "nvme": "1Gi"}}
    return inference_service(name, "standard", **spec)


def test_a_worker_pod_serves_on_its_pod_ip_and_is_scraped_there(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    cluster.apply(local_service("chat"), namespace)
    wait_ready(cluster, namespace, "chat", timeout_s=READY_S)
    (pod,) = running_pods(cluster, namespace, "chat")
    assert pod["spec"]["nodeName"].startswith("local-node-")
    ip = pod["status"]["podIP"]
    client = openai.OpenAI(base_url=f"http://{ip}:{WORKER_PORT}/v1", api_key="unused", timeout=120)
    completion = client.completions.create(model="tiny", prompt="The cache", max_tokens=4)
    assert completion.choices[0].text and completion.usage is not None
    with urllib.request.urlopen(f"http://{ip}:8001/health", timeout=10) as reply:
        assert reply.status == 200  # the KV-tier sidecar, on the pod IP too

    def scraped() -> dict[str, Any] | None:
        obj = get(cluster, "inferenceservice", "chat", namespace)
        signals = ((obj or {}).get("status") or {}).get("signals") or {}
        return signals if signals.get("kvCacheUsage") is not None else None

    wait_for(scraped, 120, what=f"the autoscaler to scrape the pod at {ip} (log {operator.log})")
    log = cluster.container_log(namespace, pod["metadata"]["name"], "engine")
    assert "engine ready" in log, log[-2000:]
    assert not Path("/etc/strata").exists(), "the config mount point must exist in the container only"
