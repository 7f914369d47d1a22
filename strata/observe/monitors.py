"""The chart's ServiceMonitor and PodMonitors as plain Prometheus scrape configs.

The test control plane has no Prometheus Operator, so the test Prometheus is configured from the
chart's rendered monitors by this small translation of the fields the chart uses (selector
matchLabels, namespaceSelector, port, path, interval, honorLabels, relabelings), the way the
Prometheus Operator generates its own configuration: one ``kubernetes_sd`` pod-role job per
endpoint, namespace/pod/container/job target labels, then the monitor's relabelings.

Two differences, both for the test control plane:

- a ServiceMonitor becomes a pod-role job over the pods its Service selects (the API server
  refuses loopback addresses in Endpoints, so the endpoints role would find nothing there);
- every job ends with a rule that keeps only targets in 127.0.0.0/8: nothing the test
  Prometheus runs may ever connect outside loopback, whatever a pod IP says.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

JsonDict = dict[str, Any]

# host:port with a 127.x.y.z host; anything else (KWOK's 10.244.x.y, a real cluster) is dropped.
LOOPBACK_TARGET = r"127\.\d{1,3}\.\d{1,3}\.\d{1,3}:\d+"
LOOPBACK_ONLY: JsonDict = {"source_labels": ["__address__"], "regex": LOOPBACK_TARGET, "action": "keep"}


@dataclass(frozen=True)
class Discovery:
    """How Prometheus reaches the API server for kubernetes_sd."""

    api_server: str
    ca_file: str
    token_file: str

    def sd_config(self, namespaces: Sequence[str] = ()) -> JsonDict:
        config: JsonDict = {
            "role": "pod",
            "api_server": self.api_server,
            "tls_config": {"ca_file": self.ca_file},
            "authorization": {"credentials_file": self.token_file},
        }
        if namespaces:
            config["namespaces"] = {"names": list(namespaces)}
        return config


class MonitorError(ValueError):
    """A monitor uses a field this translation does not support; the message names it."""


def meta_label(prefix: str, key: str) -> str:
    """A Kubernetes label key as Prometheus' discovery names it (every invalid char -> _)."""
    return prefix + re.sub(r"[^a-zA-Z0-9_]", "_", key)


def select_pods(match_labels: Mapping[str, str]) -> list[JsonDict]:
    return [
        {
            "source_labels": [meta_label("__meta_kubernetes_pod_label_", key)],
            "regex": re.escape(value),
            "action": "keep",
        }
        for key, value in sorted(match_labels.items())
    ]


def relabeling(rule: Mapping[str, Any]) -> JsonDict:
    """One Prometheus Operator RelabelConfig (camelCase) as Prometheus' relabel_config."""
    names = {
        "sourceLabels": "source_labels",
        "targetLabel": "target_label",
        "separator": "separator",
        "regex": "regex",
        "replacement": "replacement",
        "modulus": "modulus",
    }
    out: JsonDict = {names[k]: v for k, v in rule.items() if k in names}
    unknown = set(rule) - set(names) - {"action"}
    if unknown:
        raise MonitorError(f"relabelings: unsupported field(s) {sorted(unknown)}")
    out["action"] = str(rule.get("action", "replace")).lower()
    return out


def target_labels(job: str) -> list[JsonDict]:
    def copy(source: str, target: str) -> JsonDict:
        return {"source_labels": [source], "target_label": target, "action": "replace"}

    return [
        # Pods that ended are not scraped (as the Prometheus Operator does).
        {"source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)", "action": "drop"},
        copy("__meta_kubernetes_namespace", "namespace"),
        copy("__meta_kubernetes_pod_name", "pod"),
        copy("__meta_kubernetes_pod_container_name", "container"),
        {"target_label": "job", "replacement": job, "action": "replace"},
    ]


def _namespaces(monitor: JsonDict) -> list[str]:
    selector = monitor["spec"].get("namespaceSelector") or {}
    if selector.get("any"):
        return []
    return list(selector.get("matchNames") or [monitor["metadata"]["namespace"]])


def _job(
    name: str,
    job_label: str,
    endpoint: Mapping[str, Any],
    discovery: Discovery,
    namespaces: Sequence[str],
    select: list[JsonDict],
    port: str,
    interval: str | None,
) -> JsonDict:
    job: JsonDict = {
        "job_name": name,
        "honor_labels": bool(endpoint.get("honorLabels", False)),
        "metrics_path": endpoint.get("path", "/metrics"),
        "kubernetes_sd_configs": [discovery.sd_config(namespaces)],
        "relabel_configs": [
            *select,
            {
                "source_labels": ["__meta_kubernetes_pod_container_port_name"],
                "regex": re.escape(port),
                "action": "keep",
            },
            *target_labels(job_label),
            *(relabeling(r) for r in endpoint.get("relabelings") or []),
            LOOPBACK_ONLY,
        ],
    }
    every = interval or endpoint.get("interval")
    if every:
        job["scrape_interval"] = every
    return job


def pod_monitor_jobs(monitor: JsonDict, discovery: Discovery, interval: str | None = None) -> list[JsonDict]:
    meta, spec = monitor["metadata"], monitor["spec"]
    select = select_pods(spec["selector"].get("matchLabels") or {})
    return [
        _job(
            f"podMonitor/{meta['namespace']}/{meta['name']}/{i}",
            f"{meta['namespace']}/{meta['name']}",
            endpoint,
            discovery,
            _namespaces(monitor),
            select,
            str(endpoint["port"]),
            interval,
        )
        for i, endpoint in enumerate(spec["podMetricsEndpoints"])
    ]


def service_monitor_jobs(
    monitor: JsonDict, services: Sequence[JsonDict], discovery: Discovery, interval: str | None = None
) -> list[JsonDict]:
    """A pod-role job per (selected Service, endpoint): the pods behind the Service, on the
    container port the Service's named port targets."""
    meta, spec = monitor["metadata"], monitor["spec"]
    wanted = spec["selector"].get("matchLabels") or {}
    namespaces = _namespaces(monitor)
    jobs: list[JsonDict] = []
    for service in services:
        smeta = service["metadata"]
        labels = smeta.get("labels") or {}
        if namespaces and smeta["namespace"] not in namespaces:
            continue
        if any(labels.get(k) != v for k, v in wanted.items()):
            continue
        ports = {p.get("name"): p for p in service["spec"].get("ports", [])}
        for i, endpoint in enumerate(spec["endpoints"]):
            target = ports[endpoint["port"]].get("targetPort", endpoint["port"])
            if not isinstance(target, str):
                raise MonitorError(f"Service {smeta['name']}: targetPort must be a port name, got {target!r}")
            select = select_pods(service["spec"].get("selector") or {})
            name = f"serviceMonitor/{meta['namespace']}/{meta['name']}/{i}"
            job = _job(
                name, smeta["name"], endpoint, discovery, [smeta["namespace"]], select, target, interval
            )
            jobs.append(job)
    return jobs


def scrape_configs(
    manifests: Sequence[JsonDict], discovery: Discovery, interval: str | None = None
) -> list[JsonDict]:
    """Jobs for every ServiceMonitor and PodMonitor in ``manifests`` (Services among them are
    what the ServiceMonitors select); ``interval`` overrides the monitors' own."""
    services = [m for m in manifests if m.get("kind") == "Service"]
    jobs: list[JsonDict] = []
    for manifest in manifests:
        if manifest.get("kind") == "PodMonitor":
            jobs += pod_monitor_jobs(manifest, discovery, interval)
        elif manifest.get("kind") == "ServiceMonitor":
            jobs += service_monitor_jobs(manifest, services, discovery, interval)
    return jobs


def static_job(name: str, address: str, labels: Mapping[str, str], interval: str | None = None) -> JsonDict:
    """A process that runs on this machine rather than in a pod (the demo's operator and
    worker): the same target labels as a pod would get, and the same loopback-only rule."""
    job: JsonDict = {
        "job_name": name,
        "honor_labels": True,
        "static_configs": [{"targets": [address], "labels": dict(labels)}],
        "relabel_configs": [LOOPBACK_ONLY],
    }
    if interval:
        job["scrape_interval"] = interval
    return job
