"""The chart's monitors translated into scrape jobs: selection, target labels, loopback only."""

from __future__ import annotations

import re
from typing import Any

import pytest

from strata.observe.monitors import (
    LOOPBACK_TARGET,
    Discovery,
    MonitorError,
    relabeling,
    scrape_configs,
    static_job,
)

DISCOVERY = Discovery("https://127.0.0.1:6443", "/ca.crt", "/token")

POD_MONITOR = {
    "kind": "PodMonitor",
    "metadata": {"name": "strata-workers", "namespace": "strata-system"},
    "spec": {
        "namespaceSelector": {"any": True},
        "selector": {"matchLabels": {"app.kubernetes.io/component": "worker"}},
        "podMetricsEndpoints": [
            {
                "port": "kv-metrics",
                "path": "/metrics",
                "interval": "15s",
                "relabelings": [
                    {
                        "sourceLabels": ["__meta_kubernetes_pod_label_strata_dev_tier"],
                        "targetLabel": "service_tier",
                    }
                ],
            }
        ],
    },
}
SERVICE_MONITOR = {
    "kind": "ServiceMonitor",
    "metadata": {"name": "strata-operator", "namespace": "strata-system"},
    "spec": {
        "selector": {"matchLabels": {"app.kubernetes.io/name": "strata-operator"}},
        "namespaceSelector": {"matchNames": ["strata-system"]},
        "endpoints": [{"port": "metrics", "honorLabels": True, "interval": "30s"}],
    },
}
SERVICE: dict[str, Any] = {
    "kind": "Service",
    "metadata": {
        "name": "strata-metrics",
        "namespace": "strata-system",
        "labels": {"app.kubernetes.io/name": "strata-operator"},
    },
    "spec": {
        "selector": {"app.kubernetes.io/name": "strata-operator", "app.kubernetes.io/instance": "strata"},
        "ports": [{"name": "metrics", "port": 9090, "targetPort": "metrics"}],
    },
}


def test_pod_monitor_becomes_a_pod_role_job_with_the_operators_target_labels() -> None:
    (job,) = scrape_configs([POD_MONITOR], DISCOVERY)
    assert job["job_name"] == "podMonitor/strata-system/strata-workers/0"
    assert job["scrape_interval"] == "15s" and job["metrics_path"] == "/metrics"
    (sd,) = job["kubernetes_sd_configs"]
    assert sd["role"] == "pod" and "namespaces" not in sd  # namespaceSelector any
    rules = job["relabel_configs"]
    assert {
        "source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_component"],
        "regex": "worker",
        "action": "keep",
    } in rules
    assert {
        "source_labels": ["__meta_kubernetes_pod_container_port_name"],
        "regex": "kv\\-metrics",
        "action": "keep",
    } in rules
    targets = {r.get("target_label"): r for r in rules}
    assert targets["job"]["replacement"] == "strata-system/strata-workers"
    assert targets["service_tier"]["source_labels"] == ["__meta_kubernetes_pod_label_strata_dev_tier"]
    assert {"namespace", "pod", "container"} <= set(targets)


def test_every_job_ends_keeping_only_loopback_targets() -> None:
    jobs = scrape_configs([POD_MONITOR, SERVICE_MONITOR, SERVICE], DISCOVERY, interval="5s")
    assert len(jobs) == 2
    for job in jobs:
        assert job["scrape_interval"] == "5s"
        last = job["relabel_configs"][-1]
        assert last == {"source_labels": ["__address__"], "regex": LOOPBACK_TARGET, "action": "keep"}
    # Prometheus anchors relabel regexes: only 127.x.y.z:port matches.
    anchored = re.compile(f"^(?:{LOOPBACK_TARGET})$")
    assert anchored.match("127.64.1.7:8000") and anchored.match("127.0.0.1:9090")
    for outside in (
        "128.0.0.1:8000",
        "126.255.255.255:80",
        "0.0.0.0:80",
        "1127.0.0.1:80",
        "127.0.0.1.evil:80",
        "[::1]:80",
    ):
        assert not anchored.match(outside), outside


def test_service_monitor_scrapes_the_pods_its_service_selects_on_the_target_port() -> None:
    (job,) = scrape_configs([SERVICE_MONITOR, SERVICE], DISCOVERY)
    assert job["honor_labels"] is True
    assert job["kubernetes_sd_configs"][0]["namespaces"] == {"names": ["strata-system"]}
    keeps = [r for r in job["relabel_configs"] if r.get("action") == "keep"]
    assert {r["source_labels"][0] for r in keeps} >= {
        "__meta_kubernetes_pod_label_app_kubernetes_io_name",
        "__meta_kubernetes_pod_label_app_kubernetes_io_instance",
        "__meta_kubernetes_pod_container_port_name",
    }
    other = {**SERVICE, "metadata": {**SERVICE["metadata"], "labels": {"app.kubernetes.io/name": "other"}}}
    assert scrape_configs([SERVICE_MONITOR, other], DISCOVERY) == []


def test_unsupported_relabel_fields_are_refused_by_name() -> None:
    with pytest.raises(MonitorError, match="unsupported field"):
        relabeling({"sourceLabels": ["a"], "fancy": True})
    assert relabeling({"sourceLabels": ["a"], "action": "Keep", "regex": "x"})["action"] == "keep"


def test_static_jobs_for_local_processes_keep_the_loopback_rule() -> None:
    job = static_job("demo/worker", "127.0.0.1:8000", {"namespace": "tenant-a", "service": "chat"})
    assert job["static_configs"] == [
        {"targets": ["127.0.0.1:8000"], "labels": {"namespace": "tenant-a", "service": "chat"}}
    ]
    assert job["relabel_configs"] == [
        {"source_labels": ["__address__"], "regex": LOOPBACK_TARGET, "action": "keep"}
    ]
