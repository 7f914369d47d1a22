"""Operator at scale: 300 InferenceServices on 50 fake GPU nodes, from apply to Ready.

Starts its own control plane (KWOK nodes), runs the operator as the chart's ServiceAccount
(strata.stack, as in the end-to-end tests), applies every service at once across 10 tenant namespaces, and
polls until each is Ready. Ready means the operator rendered and applied every child, the
scheduler placed the GPU pod, KWOK ran it, and the operator saw the ready replica and wrote
status: the whole path a tenant waits for, minus image pulls and model loading."""

from __future__ import annotations

import json
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from strata.cluster import Cluster, ClusterConfig, launch
from strata.cluster.binaries import find_bin_dir
from strata.stack import OperatorProcess, inference_service, install_chart

SERVICES = 300
NODES = 50
TENANTS = 10
TIMEOUT_S = 900


def run() -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-operator-") as tmp:
        cluster = launch(Path(tmp) / "cluster", ClusterConfig(gpu_nodes=4), bin_dir=find_bin_dir())
        try:
            cluster.add_gpu_nodes(NODES - 4, timeout_s=300)
            operator = OperatorProcess(install_chart(cluster), Path(tmp) / "operator.log").start()
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
    watcher = ReadyWatcher(cluster).start()
    reconciles_before = operator.metric("strata_operator_reconciles_total")
    applied: dict[tuple[str, str], float] = {}
    started = time.monotonic()
    for t, ns in enumerate(namespaces):
        batch = [inference_service(f"svc-{i}") for i in range(t, SERVICES, TENANTS)]
        listed = json.dumps({"apiVersion": "v1", "kind": "List", "items": batch})
        sent = time.monotonic()  # Ready latency counts from the start of the service's batch
        cluster.kubectl("create", "-n", ns, "-f", "-", input=listed)
        applied.update({(ns, s["metadata"]["name"]): sent for s in batch})
    ready = watcher.wait(set(applied), TIMEOUT_S)
    elapsed = time.monotonic() - started
    reconciles = operator.metric("strata_operator_reconciles_total") - reconciles_before
    refreshes = operator.metric("strata_operator_status_refreshes_total")
    duration_sum = operator.metric("strata_operator_reconcile_duration_seconds_sum")
    duration_count = operator.metric("strata_operator_reconcile_duration_seconds_count")
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
        "status_refreshes": int(refreshes),
        "reconcile_mean_s": round(duration_sum / max(duration_count, 1), 3),
        "operator_peak_rss_mb": peak_rss_mb(operator),
    }
    result["summary"] = (
        f"{SERVICES} services on {NODES} nodes: Ready p50 {result['ready_p50_s']}s "
        f"p99 {result['ready_p99_s']}s, "
        f"{result['reconciles_per_s']} reconciles/s, operator peak RSS {result['operator_peak_rss_mb']} MB"
    )
    return result


class ReadyWatcher:
    """``kubectl get -w`` in a thread: the first moment each service is seen Ready. A watch,
    not polling, so the measurement neither lags by a poll interval nor loads the machine."""

    JSONPATH = '{.metadata.namespace} {.metadata.name} {.status.conditions[?(@.type=="Ready")].status}{"\\n"}'

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.ready: dict[tuple[str, str], float] = {}
        self.changed = threading.Condition()
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> ReadyWatcher:
        argv = [
            str(self.cluster.bin_dir / "kubectl"),
            f"--kubeconfig={self.cluster.kubeconfig}",
            "get",
            "inferenceservices",
            "-A",
            "--watch",
            "-o",
            f"jsonpath={self.JSONPATH}",
        ]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        threading.Thread(target=self._read, daemon=True).start()
        return self

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            parts = line.split()
            if len(parts) == 3 and parts[2] == "True":
                with self.changed:
                    self.ready.setdefault((parts[0], parts[1]), time.monotonic())
                    self.changed.notify_all()

    def wait(self, keys: set[tuple[str, str]], timeout_s: float) -> dict[tuple[str, str], float]:
        deadline = time.monotonic() + timeout_s
        with self.changed:
            while not keys <= self.ready.keys():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"only {len(keys & self.ready.keys())}/{len(keys)} Ready after {timeout_s}s"
                    )
                self.changed.wait(min(left, 5))
        assert self.proc is not None
        self.proc.terminate()
        return dict(self.ready)


def peak_rss_mb(operator: OperatorProcess) -> float:
    assert operator.proc is not None
    for line in Path(f"/proc/{operator.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError("no VmHWM in /proc status")
