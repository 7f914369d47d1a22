"""The chart's PodMonitors and the pods the operator renders agree: each monitor's selector
matches the rendered pod's labels, each port it scrapes is a named container port, and the
process behind that port serves the monitor's path. (A monitor that selects nothing scrapes
nothing, silently: only a check against the renders catches it.)"""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from aiohttp.test_utils import TestClient, TestServer

from strata.common.hold import HELD_REQUESTS_METRIC
from strata.observe.monitors import meta_label
from strata.operator import names
from strata.operator.render.configmap import render_configmap
from strata.operator.render.router import render_router
from strata.operator.render.workload import render_workload
from strata.operator.resolve import ResolveInput, resolve
from strata.operator.settings import OperatorSettings
from strata.router.config import RouterConfig
from strata.router.main import make_app

from .factories import NS_UID, isvc_body, tier_body
from .test_chart import CHART, KUBE_VERSION, helm

pytestmark = pytest.mark.cluster  # `helm template` needs bin/helm from `make cluster-bins`

MONITORING = "monitoring.coreos.com/v1"


def pod_monitors() -> dict[str, dict[str, Any]]:
    """The chart's PodMonitors by name, rendered as on a cluster with the Prometheus Operator."""
    out = helm(
        *("template", "strata", str(CHART), "-n", "strata-system", "--kube-version", KUBE_VERSION),
        *("--api-versions", f"{MONITORING}/PodMonitor"),
    )
    docs = [d for d in yaml.safe_load_all(out) if d]
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == "PodMonitor"}


def plan():
    return resolve(ResolveInput(isvc_body(), tier_body(), NS_UID))


def pod_template(workload: dict[str, Any]) -> dict[str, Any]:
    return dict(workload["spec"]["template"])


def running_containers(template: dict[str, Any]) -> list[dict[str, Any]]:
    """The containers that serve: native sidecars (init containers that keep running, as the
    KV-tier sidecar) count, as Prometheus' pod discovery lists their ports too."""
    spec = template["spec"]
    sidecars = [c for c in spec.get("initContainers", []) if c.get("restartPolicy") == "Always"]
    return [*spec["containers"], *sidecars]


def assert_selects_and_scrapes(monitor: dict[str, Any], template: dict[str, Any]) -> dict[str, int]:
    """The monitor selects this pod; its endpoints' ports by name -> the container port."""
    selector = monitor["spec"]["selector"]["matchLabels"]
    labels = template["metadata"]["labels"]
    assert selector.items() <= labels.items(), f"{monitor['metadata']['name']} does not select {labels}"
    ports = {p["name"]: p["containerPort"] for c in running_containers(template) for p in c.get("ports", [])}
    scraped = {e["port"]: ports.get(e["port"]) for e in monitor["spec"]["podMetricsEndpoints"]}
    missing = [name for name, number in scraped.items() if number is None]
    name = monitor["metadata"]["name"]
    assert not missing, f"{name} scrapes port(s) {missing}, the pod names {sorted(ports)}"
    assert_relabeled_from_pod_labels(monitor, labels)
    return {port: int(number) for port, number in scraped.items() if number is not None}


def assert_relabeled_from_pod_labels(monitor: dict[str, Any], labels: dict[str, str]) -> None:
    """Every pod label a relabeling reads (service, service_tier: what the rules and the
    dashboard aggregate by) is on the pod."""
    have = {meta_label("__meta_kubernetes_pod_label_", key) for key in labels}
    for endpoint in monitor["spec"]["podMetricsEndpoints"]:
        for rule in endpoint.get("relabelings", []):
            read = {s for s in rule.get("sourceLabels", []) if s.startswith("__meta_kubernetes_pod_label_")}
            assert read <= have, f"{monitor['metadata']['name']} relabels from {read - have}, not on the pod"


def test_the_workers_monitor_selects_the_worker_pods_and_their_metrics_ports():
    monitor = pod_monitors()["strata-workers"]
    template = pod_template(render_workload(plan(), OperatorSettings()))
    assert set(assert_selects_and_scrapes(monitor, template)) == {"http", "kv-metrics"}


async def test_the_routers_monitor_selects_the_router_pods_and_scrapes_what_the_router_serves():
    monitor = pod_monitors()["strata-routers"]
    the_plan = plan()
    deployment = render_router(the_plan, OperatorSettings())[-1]
    template = pod_template(deployment)
    ports = assert_selects_and_scrapes(monitor, template)
    workers = pod_template(render_workload(the_plan, OperatorSettings()))
    with pytest.raises(AssertionError):  # and only them: router series never pass for a worker's
        assert_selects_and_scrapes(monitor, workers)
    config = RouterConfig.from_yaml(render_configmap(the_plan)["data"][names.ROUTER_CONFIG_FILE])
    assert set(ports.values()) == {config.port}  # the port the router binds
    # the router app itself answers the monitor's path (a static worker list: no API access)
    local = config.model_copy(
        update={"workers": config.workers.model_copy(update={"static": ["http://127.0.0.1:9"]})}
    )
    async with TestClient(TestServer(make_app(local, None))) as client:
        for endpoint in monitor["spec"]["podMetricsEndpoints"]:
            resp = await client.get(endpoint["path"])
            assert resp.status == 200
            assert HELD_REQUESTS_METRIC in await resp.text()  # what the autoscaler wakes a service by
