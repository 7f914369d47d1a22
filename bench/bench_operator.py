"""Operator at scale: 300 InferenceServices on 50 fake GPU nodes, from apply to Ready.

Starts its own control plane (KWOK nodes), runs the operator as the chart's ServiceAccount
(as in the end-to-end tests), applies every service at once across 10 tenant namespaces, and
polls until each is Ready. Ready means the operator rendered and applied every child, the
scheduler placed the GPU pod, KWOK ran it, and the operator saw the ready replica and wrote
status: the whole path a tenant waits for, minus image pulls and model loading."""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from strata.cluster.binaries import find_bin_dir
from strata.cluster.cluster import Cluster, ClusterConfig, launch
from tests.operator.e2e import OperatorProcess, inference_service, install_operator_rbac

SERVICES = 300
NODES = 50
TENANTS = 10
POLL_S = 0.25
TIMEOUT_S = 900


def run() -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-operator-") as tmp:
        cluster = launch(Path(tmp) / "cluster", ClusterConfig(gpu_nodes=4), bin_dir=find_bin_dir())
        try:
            cluster.add_gpu_nodes(NODES - 4, timeout_s=300)
            operator = OperatorProcess(install_operator_rbac(cluster), Path(tmp) / "operator.log").start()
            try:
                return measure(cluster, operator)
            finally:
                operator.stop()
        finally:
            cluster.stop()


def measure(cluster: Cluster, operator: OperatorProcess) -> dict[str, Any]:
    namespaces = [f"tenant-{i}" for i in range(TENANTS)]
    for ns in namespaces:
        cluster.kubectl("create", "namespace", ns)
    reconciles_before = operator.metric("strata_operator_reconciles_total")
    applied: dict[tuple[str, str], float] = {}
    started = time.monotonic()
    for t, ns in enumerate(namespaces):
        batch = [inference_service(f"svc-{i}") for i in range(t, SERVICES, TENANTS)]
        cluster.kubectl(
            "apply",
            "-n",
            ns,
            "-f",
            "-",
            input=json.dumps({"apiVersion": "v1", "kind": "List", "items": batch}),
        )
        now = time.monotonic()
        applied.update({(ns, s["metadata"]["name"]): now for s in batch})
    ready = wait_all_ready(cluster, applied)
    elapsed = time.monotonic() - started
    reconciles = operator.metric("strata_operator_reconciles_total") - reconciles_before
    latencies = sorted(ready[key] - applied[key] for key in applied)
    result: dict[str, Any] = {
        "services": SERVICES,
        "nodes": NODES,
        "tenants": TENANTS,
        "ready_p50_s": round(statistics.median(latencies), 2),
        "ready_p99_s": round(latencies[int(0.99 * (len(latencies) - 1))], 2),
        "ready_max_s": round(latencies[-1], 2),
        "all_ready_s": round(elapsed, 2),
        "reconciles": int(reconciles),
        "reconciles_per_s": round(reconciles / elapsed, 1),
        "reconciles_per_service": round(reconciles / SERVICES, 1),
        "operator_peak_rss_mb": peak_rss_mb(operator),
        "poll_interval_s": POLL_S,
    }
    result["summary"] = (
        f"{SERVICES} services on {NODES} nodes: Ready p50 {result['ready_p50_s']}s "
        f"p99 {result['ready_p99_s']}s, "
        f"{result['reconciles_per_s']} reconciles/s, operator peak RSS {result['operator_peak_rss_mb']} MB"
    )
    return result


def wait_all_ready(cluster: Cluster, applied: dict[tuple[str, str], float]) -> dict[tuple[str, str], float]:
    ready: dict[tuple[str, str], float] = {}
    deadline = time.monotonic() + TIMEOUT_S
    while len(ready) < len(applied):
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {len(ready)}/{len(applied)} services Ready after {TIMEOUT_S}s")
        listed = cluster.kubectl_json("get", "inferenceservices", "-A")["items"]
        now = time.monotonic()
        for obj in listed:
            key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
            conds = (obj.get("status") or {}).get("conditions", [])
            if (
                key in applied
                and key not in ready
                and any(c["type"] == "Ready" and c["status"] == "True" for c in conds)
            ):
                ready[key] = now
        time.sleep(POLL_S)
    return ready


def peak_rss_mb(operator: OperatorProcess) -> float:
    assert operator.proc is not None
    for line in Path(f"/proc/{operator.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError("no VmHWM in /proc status")
