"""The test Prometheus: the chart's monitors as its jobs, the generated rules loaded, pods
discovered through kubernetes_sd against the test control plane, and nothing outside loopback
ever scraped (KWOK's pod IPs are fake 10.244.x.y addresses: they must be dropped)."""

from __future__ import annotations

import json
import re
import time
from urllib.parse import urlparse

import pytest

from strata.cluster import Cluster
from strata.observe import rules
from strata.observe.monitors import LOOPBACK_TARGET
from strata.observe.prometheus import Prometheus

pytestmark = pytest.mark.cluster


def worker_pod(name: str) -> dict[str, object]:
    labels = {
        "app.kubernetes.io/managed-by": "strata-operator",
        "app.kubernetes.io/component": "worker",
        "strata.dev/inferenceservice": "chat",
        "strata.dev/tier": "premium",
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "containers": [
                {
                    "name": "engine",
                    "image": "x.invalid/worker",
                    "ports": [{"name": "http", "containerPort": 8000}],
                }
            ],
        },
    }


def test_the_chart_monitors_are_the_jobs_and_the_rules_are_loaded(prometheus: Prometheus) -> None:
    config = prometheus.api("status/config")["yaml"]
    jobs = re.findall(r"job_name: (\S+)", config)
    assert sorted(jobs) == [
        "podMonitor/strata-system/strata-routers/0",
        "podMonitor/strata-system/strata-workers/0",
        "podMonitor/strata-system/strata-workers/1",
        "serviceMonitor/strata-system/strata-operator/0",
    ]
    loaded = [r["name"] for g in prometheus.api("rules")["groups"] for r in g["rules"]]
    assert sorted(loaded) == sorted(rules.names())


def test_pods_are_discovered_and_non_loopback_ips_are_never_scraped(
    prometheus: Prometheus, cluster: Cluster, namespace: str
) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(worker_pod("chat-0")))
    cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", "pod/chat-0", "--timeout=60s")
    ip = cluster.kubectl("get", "pod", "chat-0", "-n", namespace, "-o", "jsonpath={.status.podIP}").stdout
    assert ip and not ip.startswith("127."), "KWOK hands out fake non-loopback pod IPs"
    deadline = time.monotonic() + 60
    dropped: list[dict[str, str]] = []
    while time.monotonic() < deadline and not dropped:
        targets = prometheus.targets()
        dropped = [
            t["discoveredLabels"]
            for t in targets["droppedTargets"]
            if t["discoveredLabels"].get("__meta_kubernetes_pod_name") == "chat-0"
            and t["discoveredLabels"].get("__meta_kubernetes_namespace") == namespace
        ]
        time.sleep(1)
    assert dropped, "the worker pod was never discovered through kubernetes_sd"
    assert {d["__address__"] for d in dropped} == {f"{ip}:8000"}
    for target in prometheus.targets()["activeTargets"]:
        assert re.fullmatch(LOOPBACK_TARGET, urlparse(target["scrapeUrl"]).netloc), target["scrapeUrl"]
