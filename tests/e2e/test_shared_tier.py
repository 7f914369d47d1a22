"""The shared-storage KV tier between real replicas, end to end on the test control plane: two
worker pods of one service (`tiny` model, one thread each, the KV-tier sidecar beside each, run
by the local pod runtime) mount the service's ReadWriteMany claim (provisioned by KWOK, one
directory on this machine for both pods, as one NFS export would be):

- a prompt computed on one replica is written through to the shared volume, and the other
  replica, which never saw it, serves the prompt's prefix from there (its own counters say so);
- exactly one of the two sidecars is the volume's janitor (it alone reports the volume's bytes),
  and its sweeps see what the other replica wrote.

Every wait is on an event (a pod ready, a counter, a metric) with a generous bound."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from strata.cluster import Cluster
from strata.common.endpoints import SIDECAR_PORT, WORKER_PORT
from strata.demo import dataplane
from strata.stack import OperatorProcess, inference_service, local_pods_env, local_resources, operator_running
from strata.stack.serving import loopback_ip, pod_sample, worker_pods
from strata.stack.wait import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(3600)]
CHART_TIERS = Path(__file__).resolve().parents[2] / "charts" / "strata" / "files" / "servicetiers"
TIER = "e2e-shared"
READY_S = 900.0  # two worker pods import torch and load the model on a loaded two-core machine
WRITTEN_S = 120.0  # write-through to the shared volume follows the save, in the background
SWEPT_S = 240.0  # the janitor sweeps every 60 s
PROMPT_TOKENS = 1000  # about 62 blocks of 16 tokens
VOLUME_SERIES = 'strata_kvtier_volume_bytes{tier="shared"}'


def shared_tier() -> dict[str, Any]:
    """The chart's premium tier (write-through, shared storage on) at priority 0, so its pods wait
    for room on the local node rather than preempt anything; blocks admitted on first sight; a
    small shared volume."""
    manifest: dict[str, Any] = yaml.safe_load((CHART_TIERS / "premium.yaml").read_text())
    manifest["metadata"] = {"name": TIER}
    manifest["spec"]["priority"] = 0
    manifest["spec"]["cache"]["dram"]["admission"] = "always"
    # Larger than the prompt's blocks (about 0.5 MiB with their headers: nothing is removed) and
    # smaller than what any file system holding the test's cluster uses, so the janitor's
    # statvfs gate lets every look at the volume scan it.
    manifest["spec"]["cache"]["shared"]["sizePerService"] = "2Mi"
    return manifest


@pytest.fixture(scope="module")
def operator(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    directory = tmp_path_factory.mktemp("shared-tier")
    env = local_pods_env(directory / "nvme")
    with operator_running(cluster, directory / "operator.log", env=env) as process:
        cluster.apply(shared_tier())
        try:
            yield process
        finally:
            cluster.kubectl("delete", "servicetier", TIER, "--ignore-not-found")


def kv_metrics(pod: dict[str, Any]) -> str:
    return httpx.get(f"http://{loopback_ip(pod)}:{SIDECAR_PORT}/metrics", timeout=10).text


def volume_bytes(metrics: str) -> float | None:
    """What the volume held at the janitor's last sweep; None from a sidecar that is not the janitor."""
    for line in metrics.splitlines():
        if line.startswith(VOLUME_SERIES):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_a_replica_serves_a_prefix_another_computed_and_one_sidecar_keeps_the_volume(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    cache = {"hbm": "64Mi", "dram": "64Mi", "nvme": "0", "shared": True}
    spec = inference_service("chat", TIER, resources=local_resources("250m", "1Gi"), cache=cache)
    spec["spec"].update(replicas=2, minReplicas=2, maxReplicas=2)
    cluster.apply(spec, namespace)

    def both_answer() -> list[dict[str, Any]] | None:
        pods = worker_pods(cluster, namespace, "chat")
        return pods if len(pods) == 2 and all(pod_sample(p) for p in pods) else None

    first, second = wait_for(both_answer, READY_S, what="both replicas to answer", interval_s=2)
    api = [f"http://{loopback_ip(p)}:{WORKER_PORT}" for p in (first, second)]
    prompt = dataplane.long_prompt(PROMPT_TOKENS)

    dataplane.time_to_first_token(api[0], "tiny", prompt)  # computed on the first replica
    wait_for(
        lambda: dataplane.per_tier(kv_metrics(first), "strata_kvtier_blocks")["shared"] >= 32,
        WRITTEN_S,
        what="the first replica's sidecar to write the prompt's blocks to the shared volume",
    )
    assert dataplane.hit_tokens(api[1])["shared"] == 0
    dataplane.time_to_first_token(api[1], "tiny", prompt)  # the second never saw it
    served = dataplane.hit_tokens(api[1])
    assert served["shared"] >= 32 * 16, served  # at least the blocks the first replica wrote

    reports = [volume_bytes(kv_metrics(p)) for p in (first, second)]
    janitors = [i for i, r in enumerate(reports) if r is not None]
    assert len(janitors) == 1, f"sidecars reporting the volume (the janitor): {janitors}"
    holder = (first, second)[janitors[0]]
    swept = wait_for(
        lambda: volume_bytes(kv_metrics(holder)) or None,
        SWEPT_S,
        what="a janitor's sweep to count the blocks on the volume",
        interval_s=5,
    )
    written = dataplane.per_tier(kv_metrics(first), "strata_kvtier_used_bytes")["shared"]
    assert swept >= written > 0  # the blocks' files (with their headers) as the janitor counted them
