"""Rendering the NetworkPolicies: a service's workers take traffic only from its own routers (and
their metrics ports from the scrapers' namespaces); its routers from anyone on the serving port.
Checked against the pods the operator renders, so a selector can never drift from the labels."""

from __future__ import annotations

from typing import Any

import pytest

from strata.operator.plan import ServicePlan
from strata.operator.render.networkpolicy import NAMESPACE_NAME_LABEL, render_network_policies
from strata.operator.render.router import render_router_deployment
from strata.operator.render.workload import render_workload
from strata.operator.resolve import ResolveInput, resolve
from strata.operator.settings import OperatorSettings

from .factories import NS_UID, isvc_body, tier_body

SETTINGS = OperatorSettings(metrics_namespaces=("monitoring", "strata-system"))


def plan_of(name: str = "chat", tier: str = "standard", vllm: bool = False) -> ServicePlan:
    body = isvc_body(name=name, tier=tier)
    if vllm:
        body["spec"]["engine"] = {"kind": "vllm", "blockSize": 32, "vllm": {"args": []}}
    return resolve(ResolveInput(body, tier_body(tier), NS_UID))


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector["matchLabels"].items())


def pod_labels(plan: ServicePlan) -> tuple[dict[str, str], dict[str, str]]:
    """The labels of the worker pods and of the router pods, as the operator renders them."""
    worker = render_workload(plan, SETTINGS)["spec"]["template"]["metadata"]["labels"]
    router = render_router_deployment(plan, SETTINGS)["spec"]["template"]["metadata"]["labels"]
    return worker, router


def container_ports(template: dict[str, Any]) -> set[int]:
    spec = template["spec"]
    containers = [*spec["containers"], *spec.get("initContainers", [])]
    return {p["containerPort"] for c in containers for p in c.get("ports", [])}


def policies(plan: ServicePlan) -> tuple[dict[str, Any], dict[str, Any]]:
    worker, router = render_network_policies(plan, SETTINGS)
    return worker, router


@pytest.mark.parametrize("vllm", [False, True])
@pytest.mark.parametrize("tier", ["standard", "premium", "batch"])
def test_the_workers_take_traffic_only_from_their_own_routers(tier: str, vllm: bool) -> None:
    plan = plan_of(tier=tier, vllm=vllm)
    worker, _ = policies(plan)
    worker_labels, router_labels = pod_labels(plan)
    spec = worker["spec"]
    assert spec["policyTypes"] == ["Ingress"]
    assert selects(spec["podSelector"], worker_labels) and not selects(spec["podSelector"], router_labels)
    from_routers, from_scrapers = spec["ingress"]
    (peer,) = from_routers["from"]
    assert set(peer) == {"podSelector"}  # no namespaceSelector: the policy's own namespace only
    assert selects(peer["podSelector"], router_labels) and not selects(peer["podSelector"], worker_labels)
    template = render_workload(plan, SETTINGS)["spec"]["template"]
    assert {p["port"] for p in from_routers["ports"]} == container_ports(template)
    assert from_scrapers["ports"] == from_routers["ports"]


def test_another_services_routers_are_not_its_routers() -> None:
    worker, _ = policies(plan_of("chat"))
    _, other_routers = pod_labels(plan_of("chat-2"))
    assert not selects(worker["spec"]["ingress"][0]["from"][0]["podSelector"], other_routers)


def test_the_metrics_ports_are_open_to_the_named_namespaces_only() -> None:
    worker, _ = policies(plan_of())
    (peer,) = worker["spec"]["ingress"][1]["from"]
    assert peer == {
        "namespaceSelector": {
            "matchExpressions": [
                {"key": NAMESPACE_NAME_LABEL, "operator": "In", "values": ["monitoring", "strata-system"]}
            ]
        }
    }
    alone, _ = render_network_policies(plan_of(), OperatorSettings())
    assert len(alone["spec"]["ingress"]) == 1  # no scrapers named: the routers only


def test_the_routers_take_any_client_on_their_serving_port_only() -> None:
    plan = plan_of()
    _, router = policies(plan)
    worker_labels, router_labels = pod_labels(plan)
    spec = router["spec"]
    assert selects(spec["podSelector"], router_labels) and not selects(spec["podSelector"], worker_labels)
    (rule,) = spec["ingress"]
    assert "from" not in rule
    template = render_router_deployment(plan, SETTINGS)["spec"]["template"]
    assert [p["port"] for p in rule["ports"]] == sorted(container_ports(template)) == [plan.router.port]


def test_policies_are_owned_children_and_can_be_turned_off() -> None:
    plan = plan_of()
    worker, router = policies(plan)
    assert (worker["metadata"]["name"], router["metadata"]["name"]) == ("chat", "chat-router")
    for policy in (worker, router):
        assert policy["metadata"]["namespace"] == "team-a"
        assert policy["metadata"]["ownerReferences"][0]["uid"] == "uid-chat"
    assert render_network_policies(plan, OperatorSettings(network_policy=False)) == []
