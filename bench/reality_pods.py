"""The reality check's worker as the platform runs it: a pod that the operator renders from an
InferenceService and the local pod runtime runs for real (model-fetch init container, then the
torch engine, as processes on a loopback pod IP), on a control plane of its own.

The service asks for what the check's lone worker process was given by hand: the ``small`` model
in float32 (the API's default, bfloat16, halves a block's bytes: twice the blocks, and a first run
through a pod found hit ratio 0.32 against the simulation's 0.27), one CPU (so one torch thread),
16-token blocks, a 2,048-token step budget and an HBM cache of ``NUM_GPU_BLOCKS`` blocks
(``spec.cache.hbm`` in bytes), no lower tiers (no sidecar: the simulation it is compared with has
none), on the ``standard`` tier (its 30 s queue TTL is the worker's timeout, as in the
simulation). What it checks beyond the process: the operator's rendering of the engine's
settings, the runtime's start of the pod, and the client's path to a pod IP.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.reality_worker import ENGINE_BLOCK, MAX_BATCHED_TOKENS, MAX_CONTEXT_TOKENS, NUM_GPU_BLOCKS, Worker
from strata.cluster import Cluster, ClusterConfig, find_bin_dir, launch
from strata.common.endpoints import WORKER_PORT
from strata.sim.profiles import SMALL_KV_BYTES_PER_TOKEN
from strata.stack import inference_service, local_pods_env, local_resources, operator_running, wait_ready
from strata.stack.kube import running_pods
from strata.stack.serving import loopback_ip

NAME, NAMESPACE = "reality", "default"
ENGINE_CONTAINER = "engine"
# A pod imports torch and loads its model: minutes on a loaded two-core machine.
READY_S = 900.0


def manifest() -> dict[str, Any]:
    """One replica of the ``small`` model on the local node's CPU, sized like the lone worker."""
    hbm = NUM_GPU_BLOCKS * ENGINE_BLOCK * SMALL_KV_BYTES_PER_TOKEN
    return inference_service(
        NAME,
        "standard",
        model={
            "name": "small",
            "source": {"builtin": "small"},
            "dtype": "float32",
            "maxContextTokens": MAX_CONTEXT_TOKENS,
        },
        resources=local_resources("1", "2Gi"),
        engine={"blockSize": ENGINE_BLOCK, "maxBatchedTokens": MAX_BATCHED_TOKENS},
        cache={"hbm": str(hbm), "dram": "0", "nvme": "0"},
        replicas=1,
    )


def served_by(cluster: Cluster) -> Worker:
    """The running pod of the service, as the check addresses it: its engine on the pod IP, and
    the engine container's host process (whose engine thread's CPU time the check reads)."""
    (pod,) = running_pods(cluster, NAMESPACE, NAME)
    name = pod["metadata"]["name"]
    pid = cluster.container_pid(NAMESPACE, name, ENGINE_CONTAINER)
    if pid is None:
        raise RuntimeError(
            f"reality check: pod {name} is Running but its {ENGINE_CONTAINER} container is not"
        )
    return Worker(f"http://{loopback_ip(pod)}:{WORKER_PORT}", pid)


@contextmanager
def pod_worker(cluster: Cluster, directory: Path) -> Iterator[Worker]:
    """The chart and the operator on ``cluster`` (which has a local node), the service applied
    and Ready; its worker yielded; the service deleted, the operator stopped."""
    env = local_pods_env(directory / "nvme")
    with operator_running(cluster, directory / "operator.log", env=env):
        cluster.apply(manifest(), NAMESPACE)
        try:
            wait_ready(cluster, NAMESPACE, NAME, timeout_s=READY_S)
            yield served_by(cluster)
        finally:
            cluster.kubectl(
                "delete", "inferenceservice", NAME, "-n", NAMESPACE, "--wait=true", "--timeout=300s"
            )


@contextmanager
def own_cluster_worker(directory: Path) -> Iterator[Worker]:
    """``pod_worker`` on a control plane of its own (one local node; the service's routers go to
    the one KWOK node, where nothing runs: the check talks to the pod), stopped afterwards."""
    config = ClusterConfig(gpu_nodes=1, local_nodes=1, start_timeout_s=600)
    cluster = launch(directory / "cluster", config, bin_dir=find_bin_dir())
    try:
        with pod_worker(cluster, directory) as worker:
            yield worker
    finally:
        cluster.stop()
