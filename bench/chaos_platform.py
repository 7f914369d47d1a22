"""The platform the chaos benchmark breaks: a test control plane whose local node runs the pods
for real, the chart, the operator as its ServiceAccount, and one InferenceService of the `tiny`
model on the premium tier (DRAM, NVMe and shared tiers, write-through) with two replicas behind
its two routers, reached through its Service's ClusterIP as a tenant's clients would.

The NVMe tier's hostPath is a small tmpfs of its own where the machine allows a mount (root), so
that filling it fills nothing else; elsewhere a plain directory, and the full-volume fault is
skipped. Every address dialled is checked to be loopback."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from strata import stack
from strata.cluster.cluster import Cluster, ClusterConfig
from strata.cluster.startup import launch
from strata.operator import names
from strata.stack.serving import loopback_ip, ready_pod, ready_worker_pods, worker_pods
from strata.worker.config import WorkerConfig

NAMESPACE, SERVICE = "chaos", "chat"
TIER = "chaos-premium"
CHART_TIERS = Path(__file__).resolve().parents[1] / "charts" / "strata" / "files" / "servicetiers"
REPLICAS = 2
READY_S = 900.0  # pods import torch and load the model: minutes on a loaded two-core machine
NVME_VOLUME_BYTES = 1536 << 20  # two or three pods' NVMe tiers and the shared tier
# What the local node offers: three workers (engine and sidecar) and two routers fit in requests;
# what they use is the machine's cores, shared.
LOCAL_CPU = "8"
SHARED_CACHE = {"dram": "64Mi", "nvme": "256Mi", "shared": True}


@dataclass
class Platform:
    cluster: Cluster
    root: Path
    nvme: Path  # the host directory behind the NVMe hostPath volume
    nvme_is_mount: bool
    operator: stack.OperatorProcess
    replicas: int = REPLICAS

    @property
    def namespace(self) -> str:
        return NAMESPACE

    def kubectl_json(self, *args: str) -> Any:
        return self.cluster.kubectl_json(*args, "-n", NAMESPACE)

    def workers(self) -> list[dict[str, Any]]:
        return worker_pods(self.cluster, NAMESPACE, SERVICE)

    def routers(self) -> list[dict[str, Any]]:
        return stack.running_pods(self.cluster, NAMESPACE, SERVICE, names.router_selector_labels(SERVICE))

    def url(self) -> str:
        """The completions URL at the Service's ClusterIP (the pod runtime's proxy)."""
        svc = self.kubectl_json("get", "service", names.client_service_name(SERVICE), "-o", "json")
        ip, port = svc["spec"]["clusterIP"], svc["spec"]["ports"][0]["port"]
        if not ipaddress.ip_address(ip).is_loopback:
            raise RuntimeError(f"the Service's ClusterIP {ip} is not loopback; not dialing it")
        return f"http://{ip}:{port}/v1/completions"

    def config(self) -> WorkerConfig:
        cm = self.kubectl_json("get", "configmap", names.configmap_name(SERVICE), "-o", "json")
        return WorkerConfig.from_yaml(cm["data"][names.CONFIG_FILE])

    def container_pid(self, pod: str, container: str) -> int:
        pid = self.cluster.container_pid(NAMESPACE, pod, container)
        if pid is None:
            raise RuntimeError(f"{NAMESPACE}/{pod}: container {container} has no running process")
        return pid

    def scale(self, replicas: int) -> None:
        self.replicas = replicas
        bounds = {"replicas": replicas, "minReplicas": replicas, "maxReplicas": replicas}
        patch = ("patch", "inferenceservice", SERVICE, "-n", NAMESPACE, "--type=merge")
        self.cluster.kubectl(*patch, "-p", json.dumps({"spec": bounds}))

    def healthy(self) -> bool:
        """Ready as a tenant sees it: the service Ready, its replicas' pods Ready with every
        container ready, no pod terminating, and two routers Ready; False while the API fails."""
        try:
            service = stack.get(self.cluster, "inferenceservice", SERVICE, NAMESPACE)
            pods = stack.items(
                self.cluster, "pods", NAMESPACE, names.label_selector(names.selector_labels(SERVICE))
            )
            routers = self.routers()
        except (subprocess.SubprocessError, OSError, ValueError):
            return False
        ready = stack.condition(service, "Ready").get("status") == "True"
        return ready and _all_ready(pods, self.replicas) and sum(map(ready_pod, routers)) >= 2

    def warnings(self) -> list[str]:
        """``reason: message`` of each Warning Event on the InferenceService so far."""
        with contextlib.suppress(subprocess.SubprocessError, OSError, ValueError):
            found = stack.events(self.cluster, NAMESPACE, SERVICE)
            return [f"{e['reason']}: {e.get('message', '')}" for e in found if e.get("type") == "Warning"]
        return []

    def sidecar_metric(self, name: str) -> dict[str, float]:
        """``name``'s samples summed per worker pod UID, from each sidecar's own /metrics."""
        port = self.config().kvtier.metrics_port
        found: dict[str, float] = {}
        for pod in self.workers():
            with contextlib.suppress(OSError):
                url = f"http://{loopback_ip(pod)}:{port}/metrics"
                with urllib.request.urlopen(url, timeout=5) as reply:
                    found[pod["metadata"]["uid"]] = _sum(reply.read().decode(), name)
        return found


def _all_ready(pods: list[dict[str, Any]], replicas: int) -> bool:
    live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    if len(live) != replicas or len(pods) != replicas:
        return False
    statuses = [s for p in live for s in p["status"].get("containerStatuses") or []]
    return all(map(ready_pod, live)) and all(s.get("ready") for s in statuses)


def _sum(text: str, name: str) -> float:
    lines = [line for line in text.splitlines() if line.startswith(name)]
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines)


def service_manifest() -> dict[str, Any]:
    spec = {"replicas": REPLICAS, "minReplicas": REPLICAS, "maxReplicas": REPLICAS}
    resources = stack.local_resources("100m", "1Gi")
    return stack.inference_service(
        SERVICE, TIER, resources=resources, cache=SHARED_CACHE, autoscaling={"mode": "off"}, **spec
    )


def tier_manifest() -> dict[str, Any]:
    """The chart's premium tier, but NVMe admits a block the first time it is written: the load's
    few prompts are on NVMe at once, and the full-volume fault's new prompts are written to it."""
    manifest: dict[str, Any] = yaml.safe_load((CHART_TIERS / "premium.yaml").read_text())
    manifest["metadata"] = {"name": TIER}
    manifest["spec"]["cache"]["nvme"]["admitAfterHits"] = 0
    return manifest


def mount_nvme(directory: Path) -> bool:
    """A tmpfs of ``NVME_VOLUME_BYTES`` at ``directory``; False where mounting is not allowed."""
    directory.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        return False
    mount = ["mount", "-t", "tmpfs", "-o", f"size={NVME_VOLUME_BYTES},mode=0777", "tmpfs", str(directory)]
    return subprocess.run(mount, capture_output=True, check=False).returncode == 0


def unmount(directory: Path) -> None:
    subprocess.run(["umount", "-l", str(directory)], capture_output=True, check=False)


@contextlib.contextmanager
def platform_up() -> Iterator[Platform]:
    """The whole platform, up and Ready, then stopped and its files removed (logs kept on failure)."""
    root = Path(tempfile.mkdtemp(prefix="chaos-", dir="/tmp"))
    nvme = root / "nvme"
    mounted = mount_nvme(nvme)
    cluster = launch(root / "cluster", ClusterConfig(gpu_nodes=0, local_nodes=1, local_node_cpu=LOCAL_CPU))
    try:
        env = {**stack.local_pods_env(nvme), "STRATA_AUTOSCALE_INTERVAL_S": "2"}
        operator = stack.OperatorProcess(stack.install_chart(cluster), root / "operator.log", env=env).start()
        platform = Platform(cluster, root, nvme, mounted, operator)
        try:
            _apply_service(platform)
            yield platform
        finally:
            platform.operator.stop()
    finally:
        cluster.stop()
        if mounted:
            unmount(nvme)


def _apply_service(platform: Platform) -> None:
    cluster = platform.cluster
    cluster.apply(tier_manifest())
    cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    cluster.apply(service_manifest(), NAMESPACE)
    ready_worker_pods(cluster, NAMESPACE, SERVICE, REPLICAS, READY_S)
    wait_healthy(platform, READY_S)


def wait_healthy(platform: Platform, timeout_s: float) -> float:
    """Until the platform is healthy; when it was (time.monotonic())."""
    stack.wait_for(platform.healthy, timeout_s, what=f"{NAMESPACE}/{SERVICE} healthy", interval_s=1)
    return time.monotonic()


def wait_unhealthy(platform: Platform, timeout_s: float) -> bool:
    """Until the platform shows a fault (best effort: False when it never did within the bound)."""
    deadline = time.monotonic() + timeout_s
    while platform.healthy():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True
