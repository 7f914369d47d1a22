"""The control-plane half of the demo: cluster, chart, operator, a tenant's InferenceService."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from strata import stack
from strata.cluster import cli as cluster_cli
from strata.cluster.cluster import Cluster
from strata.cluster.nodes import machine_cpus
from strata.demo.detached import Detached
from strata.demo.walk import WalkPod
from strata.operator.api.quantity import parse_milli
from strata.operator.render.pod import SIDECAR_CPU
from strata.stack.serving import loopback_ip, worker_pods
from strata.worker.config import WorkerConfig

TENANT = "tenant-a"
SERVICE = "chat"
SERVICE_MANIFEST = Path(__file__).with_name("chat.yaml")
AUTOSCALE_INTERVAL_S = 3
UTILIZATION_WINDOW_S = 30  # the scaling act's: it scales back down in a minute, not three
READY_S = 900  # a bound: the service's pod imports torch and loads its model (minutes when loaded)


def nvme_dir(root: Path) -> Path:
    """The local node's NVMe directory (the operator's hostPath NVMe volume) of a demo directory:
    each pod's tier preallocates its file there (gigabytes of disk)."""
    return root / "nvme"


def walk_pod_millicpu() -> int:
    """What the walk-through's pod requests of the local node: its engine's CPU (chat.yaml) and
    the KV-tier sidecar's."""
    manifest = yaml.safe_load(SERVICE_MANIFEST.read_text())
    return parse_milli(manifest["spec"]["resources"]["cpu"]) + parse_milli(SIDECAR_CPU)


def start_cluster(directory: Path) -> Cluster:
    """The control plane; its local node offers this machine's CPUs plus what the walk-through's
    pod requests, which sits idle while the scaling act's pods (sized to the machine) run."""
    local_cpu = f"{machine_cpus() * 1000 + walk_pod_millicpu()}m"
    if cluster_cli.cmd_up(directory, cluster_cli.NodeCounts(gpu=4, local_cpu=local_cpu)) != 0:
        raise RuntimeError(f"the control plane did not start; logs in {directory / 'logs'}")
    return Cluster.attach(directory)


def start_operator(detached: Detached, kubeconfig: Path, nvme: Path) -> int:
    """The operator as the chart's ServiceAccount, left running; returns its metrics port."""
    metrics, liveness = stack.free_port(), stack.free_port()
    env = stack.operator_env(
        {
            "STRATA_AUTOSCALE_INTERVAL_S": str(AUTOSCALE_INTERVAL_S),
            "STRATA_UTILIZATION_WINDOW_S": str(UTILIZATION_WINDOW_S),
            # Pods may go to the local node, whose pods run for real; its NVMe volume is a
            # directory of the demo's, not the machine's /var/lib.
            **stack.local_pods_env(nvme),
        }
    )
    # One replica, so no peering: the chart names its peering object per release, and kopf given a
    # peering name it cannot find pauses without a word.
    argv = stack.operator_argv(kubeconfig, metrics, liveness, "--standalone", "--log-format=plain")
    detached.start("operator", argv, env=env)
    return metrics


def apply_service(cluster: Cluster) -> None:
    """Create the tenant and its service (install_chart waited until services are admitted)."""
    cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": TENANT}})
    cluster.kubectl("apply", "-n", TENANT, "-f", "-", input=SERVICE_MANIFEST.read_text())


def wait_ready(cluster: Cluster, timeout_s: int = READY_S) -> None:
    cluster.kubectl(
        "wait",
        "--for=condition=Ready",
        f"inferenceservice/{SERVICE}",
        "-n",
        TENANT,
        f"--timeout={timeout_s}s",
        timeout_s=timeout_s + 10,
    )


def walk_pod(cluster: Cluster, name: str | None = None) -> WalkPod:
    """The service's first pod (or the one named ``name``), with its IP and the worker.yaml its
    ConfigMap holds."""
    pods = [p for p in worker_pods(cluster, TENANT, SERVICE) if name in (None, p["metadata"]["name"])]
    if not pods:
        raise RuntimeError(f"{TENANT}/{SERVICE}: no running worker pod {name or ''}")
    config = WorkerConfig.from_yaml(rendered_worker_config(cluster))
    return WalkPod(TENANT, pods[0]["metadata"]["name"], loopback_ip(pods[0]), config)


def scale(cluster: Cluster, replicas: int) -> None:
    """Pin the service at ``replicas`` (min = max = desired), as a tenant would with kubectl."""
    bounds = {"replicas": replicas, "minReplicas": replicas, "maxReplicas": replicas}
    patch = ("patch", "inferenceservice", SERVICE, "-n", TENANT, "--type=merge")
    cluster.kubectl(*patch, "-p", json.dumps({"spec": bounds}))


def status_signals(cluster: Cluster) -> dict[str, Any]:
    """The service's ``status.signals`` as the operator last wrote them ({} before the first)."""
    service = cluster.kubectl_json("get", "inferenceservice", SERVICE, "-n", TENANT)
    return dict((service.get("status") or {}).get("signals") or {})


def observed_at(signals: dict[str, Any]) -> datetime | None:
    """When the operator scraped the signals (``observedAt``, RFC 3339 in UTC), or None."""
    value = signals.get("observedAt")
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC) if value else None


def signals(cluster: Cluster) -> str:
    """The live signals the autoscaler wrote into the service's status, and what the workers
    report of their model, as a tenant sees them."""
    service = cluster.kubectl_json("get", "inferenceservice", SERVICE, "-n", TENANT)
    status = service.get("status") or {}
    shown = {k: status.get(k) for k in ("signals", "model", "lastScaling")}
    return yaml.safe_dump({k: v for k, v in shown.items() if v}, sort_keys=False)


def rendered_worker_config(cluster: Cluster) -> str:
    """The worker.yaml the operator rendered into the service's ConfigMap."""
    cm = cluster.kubectl_json("get", "configmap", f"{SERVICE}-config", "-n", TENANT)
    text: str = cm["data"]["worker.yaml"]
    return text


def show(cluster: Cluster) -> str:
    """What a tenant and an admin would look at: the service, its pods on GPU nodes, Events."""
    parts = [
        cluster.kubectl("get", "servicetiers").stdout,
        cluster.kubectl("get", "inferenceservices", "-A").stdout,
        cluster.kubectl(
            "get",
            "pods",
            "-n",
            TENANT,
            "-o",
            "wide",
            "-L",
            "strata.dev/tier",
        ).stdout,
        _pod_summary(cluster),
        cluster.kubectl(
            "get",
            "events",
            "-n",
            TENANT,
            "--field-selector",
            f"involvedObject.name={SERVICE}",
            "--sort-by=.lastTimestamp",
        ).stdout,
    ]
    return "\n".join(p.rstrip() for p in parts if p.strip())


def _pod_summary(cluster: Cluster) -> str:
    pods = cluster.kubectl_json("get", "pods", "-n", TENANT, "-l", f"app.kubernetes.io/instance={SERVICE}")
    if not pods["items"]:
        return ""
    spec = pods["items"][0]["spec"]
    engine = next(c for c in spec["containers"] if c["name"] == "engine")
    sidecars = [c["name"] for c in spec.get("initContainers", []) if c.get("restartPolicy") == "Always"]
    summary = {
        "engine.resources": engine["resources"],
        "native sidecars": sidecars,
        "volumes": sorted(v["name"] for v in spec["volumes"]),
        "priorityClassName": spec.get("priorityClassName"),
        "securityContext": spec.get("securityContext"),
    }
    return "first pod, summarised:\n" + yaml.safe_dump(json.loads(json.dumps(summary)), sort_keys=False)


def show_pod(cluster: Cluster, pod: WalkPod) -> str:
    """The walk-through's pod as the runtime runs it: each container's host process and command
    line (from the pod spec), and where each volume lives."""
    obj = cluster.kubectl_json("get", "pod", pod.name, "-n", pod.namespace)
    spec = obj["spec"]
    lines = [
        f"{pod.namespace}/{pod.name} on {spec['nodeName']} at {pod.ip}, run by the cluster's pod runtime:"
    ]
    sidecars = [c for c in spec.get("initContainers", []) if c.get("restartPolicy") == "Always"]
    for container in (*sidecars, *spec["containers"]):
        pid = cluster.container_pid(pod.namespace, pod.name, container["name"])
        argv = " ".join([*container.get("command", []), *container.get("args", [])])
        lines.append(f"  {container['name']:<8} pid {pid}: {argv}")
    lines += [f"  volume {line}" for line in volume_lines(spec["volumes"])]
    return "\n".join(lines)


def volume_lines(volumes: list[dict[str, Any]]) -> list[str]:
    """One line per pod volume: its kind and what it keeps across container restarts."""
    lines = []
    for volume in volumes:
        if "hostPath" in volume:
            lines.append(
                f"{volume['name']}: hostPath {volume['hostPath']['path']} (the node's; outlives the pod)"
            )
        elif "emptyDir" in volume:
            empty = volume["emptyDir"]
            medium = "tmpfs" if empty.get("medium") == "Memory" else "directory"
            size = f" of {empty['sizeLimit']}" if empty.get("sizeLimit") else ""
            lines.append(f"{volume['name']}: emptyDir, a {medium}{size} (lives as long as the pod)")
        elif "configMap" in volume:
            lines.append(f"{volume['name']}: ConfigMap {volume['configMap']['name']}")
        else:
            lines.append(f"{volume['name']}: {', '.join(k for k in volume if k != 'name')}")
    return lines
