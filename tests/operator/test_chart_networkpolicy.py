"""The chart's NetworkPolicy switch: the operator pods' own policy, and the settings by which the
operator renders each service's (on by default, off with one value)."""

from __future__ import annotations

import pytest

from strata.operator.settings import settings_from_env

from .test_chart import by_kind, env_of, render

pytestmark = pytest.mark.cluster  # needs bin/helm from `make cluster-bins`


def test_the_operator_pods_take_traffic_on_their_metrics_and_health_ports_only() -> None:
    docs = render("operator.metricsPort=9191")
    (policy,) = by_kind(docs, "NetworkPolicy")
    (deployment,) = by_kind(docs, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    spec = policy["spec"]
    assert policy["metadata"]["namespace"] == "strata-system"
    assert spec["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert spec["policyTypes"] == ["Ingress"]
    (rule,) = spec["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 9191}, {"protocol": "TCP", "port": 8080}]


def test_the_operator_renders_service_policies_allowing_scrapes_from_its_namespace() -> None:
    settings = settings_from_env(env_of(render("networkPolicy.metricsNamespaces={monitoring}")))
    assert settings.network_policy
    assert settings.metrics_namespaces == ("monitoring", "strata-system")


def test_one_value_turns_every_policy_off() -> None:
    docs = render("networkPolicy.enabled=false")
    assert by_kind(docs, "NetworkPolicy") == []
    assert not settings_from_env(env_of(docs)).network_policy


def test_the_operator_may_write_network_policies_but_never_get_them() -> None:
    (role,) = [r for r in by_kind(render(), "ClusterRole") if r["metadata"]["name"] == "strata-strata-system"]
    (rule,) = [r for r in role["rules"] if "networkpolicies" in r["resources"]]
    assert rule["apiGroups"] == ["networking.k8s.io"]
    assert rule["verbs"] == ["list", "watch", "create", "patch"]
