"""The control-plane half of the demo: cluster, chart, operator, a tenant's InferenceService."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import yaml

from strata.cluster import binaries
from strata.cluster import cli as cluster_cli
from strata.cluster.cluster import Cluster, KubectlError
from strata.demo.detached import Detached

ROOT = binaries.REPO_ROOT
RELEASE = "strata"
SYSTEM_NAMESPACE = "strata-system"
TENANT = "tenant-a"
SERVICE = "chat"
SERVICE_MANIFEST = Path(__file__).with_name("chat.yaml")
AUTOSCALE_INTERVAL_S = 3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_cluster(directory: Path) -> Cluster:
    if cluster_cli.cmd_up(directory, gpu_nodes=4) != 0:
        raise RuntimeError(f"the control plane did not start; logs in {directory / 'logs'}")
    return Cluster.attach(directory)


def install_chart(cluster: Cluster) -> Path:
    """`helm upgrade --install` of charts/strata with no operator pods (fake nodes run no
    containers: the operator runs on this machine instead), as its own ServiceAccount."""
    helm = [str(cluster.bin_dir / "helm"), "--kubeconfig", str(cluster.kubeconfig)]
    chart = str(ROOT / "charts" / "strata")
    args = ["upgrade", "--install", RELEASE, chart, "-n", SYSTEM_NAMESPACE, "--create-namespace"]
    done = subprocess.run(
        [*helm, *args, "--set", "operator.replicas=0"], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"helm {' '.join(args)} failed: {done.stderr.strip()}")
    return cluster.service_account_kubeconfig(SYSTEM_NAMESPACE, RELEASE)


def start_operator(detached: Detached, kubeconfig: Path, worker_address: str) -> int:
    """The operator as the chart's ServiceAccount; returns its metrics port. Fake pods have fake
    IPs, so the autoscaler scrapes the one worker running here (``worker_address``) instead."""
    metrics, liveness = free_port(), free_port()
    env = {
        **os.environ,
        "STRATA_NVME_VOLUME": "hostPath",
        "STRATA_NVME_HOST_PATH": "/var/lib/strata/nvme",
        "STRATA_SCRAPE_ADDRESS": worker_address,
        "STRATA_AUTOSCALE_INTERVAL_S": str(AUTOSCALE_INTERVAL_S),
    }
    detached.start(
        "operator",
        [
            sys.executable,
            "-m",
            "strata",
            "operator",
            f"--kubeconfig={kubeconfig}",
            f"--metrics-port={metrics}",
            f"--liveness=http://127.0.0.1:{liveness}/healthz",
            "--log-format=plain",
        ],
        env=env,
    )
    return metrics


def apply_service(cluster: Cluster, timeout_s: float = 120.0) -> None:
    """Create the tenant and its service. Right after install the admission policy refuses writes
    until its ServiceTier parameter is resolvable (~20 s), so retry that refusal only."""
    cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": TENANT}})
    manifest = SERVICE_MANIFEST.read_text()
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            cluster.kubectl("apply", "-n", TENANT, "-f", "-", input=manifest)
            return
        except KubectlError as exc:
            if "paramKind" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(2)


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
