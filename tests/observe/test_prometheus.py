"""The test Prometheus: the chart's monitors as its jobs, the generated rules loaded, pods
discovered through kubernetes_sd against the test control plane, and nothing outside loopback
ever scraped."""

from __future__ import annotations

import json
import re
from urllib.parse import urlparse

import pytest

from strata.cluster import Cluster
from strata.observe import rules
from strata.observe.monitors import LOOPBACK_TARGET
from strata.observe.prometheus import Prometheus
from strata.stack import wait_for

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


def test_pods_are_discovered_and_only_loopback_addresses_are_scraped(
    prometheus: Prometheus, cluster: Cluster, namespace: str
) -> None:
    """A KWOK pod's IP is a loopback address from its node's range (docs/cluster.md): it becomes
    an active target at that address (down: nothing listens there). Were it not loopback, it
    would be dropped, never dialled (the rule itself: tests/observe/test_monitors.py)."""
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(worker_pod("chat-0")))
    cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", "pod/chat-0", "--timeout=60s")
    ip = cluster.kubectl("get", "pod", "chat-0", "-n", namespace, "-o", "jsonpath={.status.podIP}").stdout
    address = f"{ip}:8000"

    def discovered() -> tuple[list[str], list[str]] | None:
        targets = prometheus.targets()
        active = [t["scrapeUrl"] for t in targets["activeTargets"] if mine(t["discoveredLabels"])]
        dropped = [
            t["discoveredLabels"]["__address__"]
            for t in targets["droppedTargets"]
            if mine(t["discoveredLabels"])
        ]
        return (active, dropped) if active or dropped else None

    def mine(labels: dict[str, str]) -> bool:
        return (
            labels.get("__meta_kubernetes_namespace") == namespace
            and labels.get("__meta_kubernetes_pod_name") == "chat-0"
            and labels.get("__meta_kubernetes_pod_container_port_name") == "http"
        )

    active, dropped = wait_for(discovered, 60, what="the worker pod discovered through kubernetes_sd")
    if re.fullmatch(LOOPBACK_TARGET, address):
        assert f"http://{address}/metrics" in active
    else:
        assert active == [] and address in dropped
    for target in prometheus.targets()["activeTargets"]:
        assert re.fullmatch(LOOPBACK_TARGET, urlparse(target["scrapeUrl"]).netloc), target["scrapeUrl"]
