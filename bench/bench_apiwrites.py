"""What one operator write costs the API server, next to the raw phase's write, side by side.

The operator benchmark compares the operator's burst with a "raw" phase that creates plain
ConfigMaps of the children's sizes. This benchmark takes that comparison apart on one control
plane with the operator's own client (strata.operator.kube: server-side apply, 32 in flight):

1. ``cluster_ip``: 300 Services that get a ClusterIP, written with 1, 4 and 32 in flight, and
   300 headless ones with 32, on the fresh cluster: whether the API server writes them
   concurrently (seconds for all, its own mean latency);
2. ``services`` services per variant, each variant in namespaces of its own, one after the other:

   - ``cm_apply`` / ``cm_create``: the raw phase's ConfigMaps by server-side apply / by POST;
   - ``children_apply_idle``: the children the operator renders for a service
     (bench.fleet.unowned_children: config, two Services, two PDBs, the workload, the router's
     account, Role, binding and Deployment) by server-side apply, both Deployments at 0
     replicas: the children without the pods they cause;
   - ``children_apply`` / ``children_create``: the same with the replicas they are rendered
     with, so the controllers create ReplicaSets and pods as in the burst, by server-side apply /
     by POST.

   For each: the seconds until every object was written, the mean answer the client saw, the
   CPU seconds each control-plane process (API server, etcd, controller-manager, scheduler,
   KWOK) used from the first write until the cluster settled (every Deployment of the variant
   has its replicas ready, bounded), per service, and the API server's own mean latency per
   verb and resource (``apiserver_request_duration_seconds``)."""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import fleet
from strata.cluster import Cluster, ClusterConfig, GpuNodeShape, find_bin_dir, launch
from strata.operator.kube import ClientPolicy, KubeClient, object_path
from strata.stack import install_chart

Obj = dict[str, Any]
SETTLE_TIMEOUT_S = 600.0
SETTLE_POLL_S = 2.0
COMPONENTS = ("kube-apiserver", "etcd", "kube-controller-manager", "kube-scheduler", "kwok")
CLUSTER_IP_SERVICES = 300
CLUSTER_IP_IN_FLIGHT = (1, 4, 32)


@dataclass(frozen=True)
class Variant:
    name: str
    objects: Callable[[str, str], list[Obj]]  # (namespace, service) -> manifests
    create: bool = False  # POST instead of server-side apply


def _configmaps(namespace: str, service: str) -> list[Obj]:
    return [
        fleet.sized_configmap(namespace, f"{service}-{j}", size) for j, size in enumerate(fleet.child_sizes())
    ]


def _idle_children(namespace: str, service: str) -> list[Obj]:
    out = fleet.unowned_children(namespace, service)
    for child in out:
        if child["kind"] in ("Deployment", "StatefulSet"):
            child["spec"]["replicas"] = 0
    return out


VARIANTS = (
    Variant("cm_apply", _configmaps),
    Variant("cm_create", _configmaps, create=True),
    Variant("children_apply_idle", _idle_children),
    Variant("children_apply", fleet.unowned_children),
    Variant("children_create", fleet.unowned_children, create=True),
)


def run(services: int = 200, tenants: int = 10) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-apiwrites-") as tmp:
        nodes = max(1, -(-services * len(VARIANTS) // 20))
        config = ClusterConfig(gpu_nodes=nodes, node_shape=GpuNodeShape(gpus=20), start_timeout_s=600)
        cluster = launch(Path(tmp) / "cluster", config, bin_dir=find_bin_dir())
        try:
            install_chart(cluster)
            cluster.kubectl("apply", "--validate=false", "-f", "-", input=fleet.priority_class_json())
            result: dict[str, Any] = {"cluster_ip": cluster_ip(cluster), "services": services}
            result["objects_per_service"] = len(fleet.unowned_children("n", "s"))
            for variant in VARIANTS:
                result[variant.name] = measure(cluster, variant, services, tenants)
            result["summary"] = _summary(result)
            return result
        finally:
            cluster.stop()


def cluster_ip(cluster: Cluster) -> dict[str, Any]:
    """Services written with more or fewer in flight: the same seconds for all of them, whatever
    the number in flight, is an API server that writes them one at a time."""
    out = {}
    for headless, in_flight in [(False, n) for n in CLUSTER_IP_IN_FLIGHT] + [(True, 32)]:
        name = f"{'headless' if headless else 'cluster-ip'}-{in_flight}"
        fleet.create_namespaces(cluster, [name])
        manifests = [_service(name, f"s{i}", headless) for i in range(CLUSTER_IP_SERVICES)]
        before = fleet.apiserver_metrics(cluster)
        seconds, _ = asyncio.run(_write_all(cluster.kubeconfig, manifests, False, in_flight))
        latency = fleet.mean_latencies(before, fleet.apiserver_metrics(cluster)).get("APPLY services")
        out[name] = {"written_s": round(seconds, 2), "apiserver_mean_s": latency}
    return out


def _service(namespace: str, name: str, headless: bool) -> Obj:
    spec: Obj = {"selector": {"app": name}, "ports": [{"name": "http", "port": 8000}]}
    if headless:
        spec["clusterIP"] = "None"
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def measure(cluster: Cluster, variant: Variant, services: int, tenants: int) -> dict[str, Any]:
    spaces = [f"{variant.name.replace('_', '-')}-{i}" for i in range(tenants)]
    fleet.create_namespaces(cluster, spaces)
    manifests = [m for i in range(services) for m in variant.objects(spaces[i % tenants], f"svc-{i}")]
    cpu_before, server_before = _cpu(cluster), fleet.apiserver_metrics(cluster)
    written_s, answer_s = asyncio.run(_write_all(cluster.kubeconfig, manifests, variant.create))
    settled_s = _settle(cluster, spaces)
    cpu = {k: round((v - cpu_before[k]) / services, 4) for k, v in _cpu(cluster).items()}
    return {
        "objects": len(manifests),
        "written_s": round(written_s, 2),
        "client_answer_mean_s": round(answer_s, 4),
        "settled_s": round(settled_s, 2),
        "cpu_s_per_service": cpu,
        "apiserver_mean_s": fleet.mean_latencies(server_before, fleet.apiserver_metrics(cluster)),
    }


async def _write_all(
    kubeconfig: Path, manifests: list[Obj], create: bool, in_flight: int = ClientPolicy.max_in_flight
) -> tuple[float, float]:
    """Write every manifest at once under the client's in-flight limit: (seconds, mean answer)."""
    client = KubeClient.from_environment(str(kubeconfig), ClientPolicy(max_in_flight=in_flight))
    answers: list[float] = []

    async def one(manifest: Obj) -> None:
        started = time.monotonic()
        if create:
            meta = manifest["metadata"]
            path = object_path(manifest["apiVersion"], manifest["kind"], None, meta["namespace"])
            await client.request("POST", path, body=manifest)
        else:
            await client.apply(manifest)
        answers.append(time.monotonic() - started)

    started = time.monotonic()
    try:
        await asyncio.gather(*(one(m) for m in manifests))
    finally:
        await client.close()
    return time.monotonic() - started, sum(answers) / max(len(answers), 1)


def _settle(cluster: Cluster, spaces: list[str]) -> float:
    """Seconds until every Deployment in ``spaces`` has its replicas ready (bounded)."""
    started = time.monotonic()
    while time.monotonic() - started < SETTLE_TIMEOUT_S:
        listed = cluster.kubectl_json("get", "deployments", "-A")["items"]
        mine = [d for d in listed if d["metadata"]["namespace"] in spaces]
        if all(d.get("status", {}).get("readyReplicas", 0) >= d["spec"]["replicas"] for d in mine):
            return time.monotonic() - started
        time.sleep(SETTLE_POLL_S)
    raise TimeoutError(f"Deployments in {spaces[0]}... not ready within {SETTLE_TIMEOUT_S:.0f}s")


def _cpu(cluster: Cluster) -> dict[str, float]:
    pids = {p.name: p.pid for p in cluster.owned_processes if p.name in COMPONENTS}
    return {name: fleet.cpu_seconds(pid) for name, pid in pids.items()}


def _summary(r: dict[str, Any]) -> str:
    ip = ", ".join(f"{k} {v['written_s']}s" for k, v in r["cluster_ip"].items())
    parts = []
    for v in VARIANTS:
        m = r[v.name]
        parts.append(
            f"{v.name} {m['written_s']}s (apiserver {m['cpu_s_per_service']['kube-apiserver']} "
            f"CPU s/service, all {round(sum(m['cpu_s_per_service'].values()), 3)})"
        )
    return f"{CLUSTER_IP_SERVICES} Services: {ip}; {r['services']} services per variant: " + "; ".join(parts)
