"""The control-plane half of the demo: cluster, chart, operator, a tenant's InferenceService."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from strata import stack
from strata.cluster import cli as cluster_cli
from strata.cluster.cluster import Cluster
from strata.cluster.nodes import LOCAL_TOLERATION
from strata.demo.detached import Detached

TENANT = "tenant-a"
SERVICE = "chat"
SERVICE_MANIFEST = Path(__file__).with_name("chat.yaml")
AUTOSCALE_INTERVAL_S = 3
UTILIZATION_WINDOW_S = 30  # the scaling act's: it scales back down in a minute, not three


def start_cluster(directory: Path) -> Cluster:
    if cluster_cli.cmd_up(directory, cluster_cli.NodeCounts(gpu=4)) != 0:
        raise RuntimeError(f"the control plane did not start; logs in {directory / 'logs'}")
    return Cluster.attach(directory)


def start_operator(detached: Detached, kubeconfig: Path) -> int:
    """The operator as the chart's ServiceAccount, left running; returns its metrics port."""
    metrics, liveness = stack.free_port(), stack.free_port()
    env = stack.operator_env(
        {
            "STRATA_AUTOSCALE_INTERVAL_S": str(AUTOSCALE_INTERVAL_S),
            "STRATA_UTILIZATION_WINDOW_S": str(UTILIZATION_WINDOW_S),
            # pods may go to the local node, whose pods run for real (the scaling act's)
            "STRATA_TOLERATIONS": json.dumps([LOCAL_TOLERATION]),
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


def wait_ready(cluster: Cluster, timeout_s: int = 180) -> None:
    cluster.kubectl(
        "wait",
        "--for=condition=Ready",
        f"inferenceservice/{SERVICE}",
        "-n",
        TENANT,
        f"--timeout={timeout_s}s",
        timeout_s=timeout_s + 10,
    )


def pod_ip(cluster: Cluster) -> str:
    """The IP of the service's (KWOK) pod: a loopback address of this cluster's own range, where
    the worker started here listens in the pod's place, so the operator scrapes it there."""
    pods = cluster.kubectl_json("get", "pods", "-n", TENANT, "-l", f"app.kubernetes.io/instance={SERVICE}")
    ips = [p["status"]["podIP"] for p in pods["items"] if p["status"].get("podIP")]
    if not ips:
        raise RuntimeError(f"{TENANT}/{SERVICE}: no pod with an IP")
    return str(ips[0])


def status_signals(cluster: Cluster) -> dict[str, Any]:
    """The service's ``status.signals`` as the operator last wrote them ({} before the first)."""
    service = cluster.kubectl_json("get", "inferenceservice", SERVICE, "-n", TENANT)
    return dict((service.get("status") or {}).get("signals") or {})


def signals(cluster: Cluster) -> str:
    """The live signals the autoscaler wrote into the service's status, as a tenant sees them."""
    service = cluster.kubectl_json("get", "inferenceservice", SERVICE, "-n", TENANT)
    status = service.get("status") or {}
    shown = {"signals": status.get("signals"), "lastScaling": status.get("lastScaling")}
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
