"""The built-in autoscaler end to end: the operator (as the chart's ServiceAccount) scrapes the
pods of two services at their pod IPs, where this test serves a busy worker's metrics (the pods
are KWOK's and run nothing; their IPs are loopback addresses this process can bind), fills
status.signals for both and scales only the builtin one."""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from strata.cluster.cluster import Cluster
from strata.common.endpoints import WORKER_PORT
from strata.stack import (
    OperatorProcess,
    events,
    get,
    inference_service,
    operator_running,
    wait_for,
    wait_ready,
)

pytestmark = pytest.mark.cluster
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)  # the worker's


class BusyWorker:
    """A worker's /metrics under load: KV 90 % full, and every scrape sees 5 more requests
    whose first token took 7 s, so TTFT p95 over any interval is far above the tier's 1 s."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        Gauge("strata_worker_kv_cache_usage_ratio", "", registry=self.registry).set(0.9)
        Gauge("strata_worker_queue_length", "", registry=self.registry).set(2)
        self.ttft = Histogram(
            "strata_worker_time_to_first_token_seconds", "", buckets=BUCKETS, registry=self.registry
        )
        self.hits = Counter("strata_worker_prefix_hit_tokens", "", ["tier"], registry=self.registry)
        self.prompt = Counter("strata_worker_prompt_tokens", "", registry=self.registry)
        self.lock = threading.Lock()

    def render(self) -> bytes:
        with self.lock:
            for _ in range(5):
                self.ttft.observe(7.0)
            self.prompt.inc(100)
            self.hits.labels("hbm").inc(25)
            self.hits.labels("dram").inc(50)
            return generate_latest(self.registry)


class PodMetrics:
    """Serves ``worker``'s /metrics on port 8000 of every worker pod's IP as the pods appear."""

    def __init__(self, cluster: Cluster, worker: BusyWorker) -> None:
        self.cluster = cluster
        self.handler = _handler(worker)
        self.servers: dict[str, ThreadingHTTPServer] = {}
        self.taken: set[str] = set()  # IPs a real process serves: a local-node pod of another test
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._follow, daemon=True)

    def _follow(self) -> None:
        while not self.stop.wait(1.0):
            listed = self.cluster.kubectl(
                "get",
                "pods",
                "-A",
                "-l",
                "app.kubernetes.io/component=worker",
                "-o",
                "jsonpath={.items[*].status.podIP}",
                check=False,
            ).stdout.split()
            for ip in set(listed) - set(self.servers) - self.taken:
                self._serve(ip)

    def _serve(self, ip: str) -> None:
        try:
            server = ThreadingHTTPServer((ip, WORKER_PORT), self.handler)
        except OSError:
            # Pods of every namespace are listed, so a real worker still draining on the local
            # node (an earlier test's) may hold its IP: it is not ours to stand in for, and the
            # loop must go on serving the pods that appear after it.
            self.taken.add(ip)
            return
        self.servers[ip] = server
        threading.Thread(target=server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        for server in self.servers.values():
            server.shutdown()
            server.server_close()


def _handler(worker: BusyWorker) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = worker.render() if self.path == "/metrics" else b""
            self.send_response(200 if body else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


@pytest.fixture(scope="module")
def pod_metrics(cluster: Cluster) -> Iterator[PodMetrics]:
    served = PodMetrics(cluster, BusyWorker())
    served.thread.start()
    try:
        yield served
    finally:
        served.close()


@pytest.fixture(scope="module")
def operator(
    cluster: Cluster, pod_metrics: PodMetrics, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    env = {"STRATA_AUTOSCALE_INTERVAL_S": "1"}
    with operator_running(cluster, tmp_path_factory.mktemp("operator") / "operator.log", env=env) as process:
        yield process


@pytest.fixture
def tier(cluster: Cluster) -> Iterator[str]:
    """No scale-up stabilisation, so the test sees several decisions in a few seconds."""
    name = f"autoscale-{uuid.uuid4().hex[:6]}"
    cluster.apply(
        {
            "apiVersion": "strata.dev/v1alpha1",
            "kind": "ServiceTier",
            "metadata": {"name": name},
            "spec": {
                "priority": 50000,
                "slo": {"ttftP95Ms": 1000},
                "cache": {"dram": {"maxSize": "4Gi"}, "nvme": {"maxSize": "100Gi"}},
                "autoscaling": {
                    "targetKvCacheUsage": 0.8,
                    "scaleUpStabilizationSeconds": 0,
                    "maxScaleUpStep": 1,
                    "minReplicas": 1,
                    "maxReplicas": 4,
                },
            },
        }
    )
    try:
        yield name
    finally:
        cluster.kubectl("delete", "servicetier", name, "--ignore-not-found", "--wait=false", check=False)


def steps(cluster: Cluster, namespace: str, name: str) -> list[tuple[int, int, str]]:
    """(from, to, message) of every Scaled Event of the service."""
    found = []
    for event in events(cluster, namespace, name):
        if event["reason"] == "Scaled":
            match = re.search(r": (\d+) -> (\d+)", event["message"])
            assert match, event["message"]
            found.append((int(match[1]), int(match[2]), event["message"]))
    return found


def test_builtin_scales_up_within_its_step_and_off_only_reports(
    cluster: Cluster, namespace: str, tier: str, operator: OperatorProcess
) -> None:
    for name, mode in (("auto", "builtin"), ("manual", "off")):
        spec = {"replicas": 1, "maxReplicas": 4, "autoscaling": {"mode": mode}}
        cluster.apply(inference_service(name, tier, **spec), namespace)
    for name in ("auto", "manual"):
        wait_ready(cluster, namespace, name)

    def at_max() -> dict[str, Any] | None:
        obj = get(cluster, "inferenceservice", "auto", namespace)
        last = (obj.get("status") or {}).get("lastScaling") or {}
        return obj if last.get("toReplicas") == 4 and obj["spec"]["replicas"] == 4 else None

    auto = wait_for(at_max, 300, what=f"scaling up to maxReplicas 4 (log {operator.log})")
    # KV usage 0.9 > 0.8 and TTFT p95 of 7 s > 1 s with requests waiting (the TTFT asks for at
    # most double the ready pods): each decision adds at most the tier's step of 1.
    made = wait_for(lambda: steps(cluster, namespace, "auto"), 60, what="Scaled Events")
    assert all(0 < to - frm <= 1 for frm, to, _ in made), made
    assert any("(max step 1)" in message for _, _, message in made), made
    assert "> target" in auto["status"]["lastScaling"]["reason"]
    signals = auto["status"]["signals"]
    assert signals["kvCacheUsage"] == 0.9 and signals["requestsWaiting"] >= 2
    assert signals["ttftP95Ms"] > 5000  # 7 s observations, interpolated inside the (5, 10] bucket
    assert signals["prefixHitRatio"] == {"dram": 0.5, "hbm": 0.25}

    def reported() -> dict[str, Any] | None:
        obj = get(cluster, "inferenceservice", "manual", namespace)
        return obj if ((obj.get("status") or {}).get("signals") or {}).get("kvCacheUsage") else None

    # Its pod's stand-in endpoint may not have been up at its first scrapes (served once a
    # listing of the pods shows its IP, seconds late on a loaded machine), and each failed scrape
    # pushes the next one back (5 s, 10, 20, ... up to 120): its signals may come after auto's.
    manual = wait_for(reported, 300, what=f"manual's signals (log {operator.log})")
    assert manual["status"]["signals"]["kvCacheUsage"] == 0.9
    assert manual["spec"]["replicas"] == 1 and "lastScaling" not in manual["status"]
    assert steps(cluster, namespace, "manual") == []
