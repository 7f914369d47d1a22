"""Operator settings from flags and environment: bad values name the setting."""

from __future__ import annotations

import pytest

from strata.operator.cli import build_settings, parser
from strata.operator.replicas import desired_replicas
from strata.operator.settings import SettingsError, settings_from, settings_from_env


def test_environment_is_read():
    s = settings_from_env(
        {
            "STRATA_NVME_VOLUME": "hostPath",
            "STRATA_METRICS_PORT": "9191",
            "STRATA_METRICS_HOST": "127.64.1.2",
            "STRATA_TOLERATIONS": '[{"key": "a", "operator": "Exists"}]',
            "STRATA_IMAGE_PULL_SECRETS": '[{"name": "regcred"}, {"name": "mirror.creds"}]',
            "STRATA_ROUTER_NODE_SELECTOR": '{"pool": "cpu", "kubernetes.io/os": "linux"}',
            "STRATA_ROUTER_RESOURCES": '{"requests": {"cpu": "50m"}, "limits": {"memory": "1.5Gi"}}',
            "STRATA_NETWORK_POLICY": "false",
            "STRATA_METRICS_NAMESPACES": '["strata-system", "monitoring", "monitoring"]',
        }
    )
    assert not s.network_policy and s.metrics_namespaces == ("monitoring", "strata-system")
    assert s.router_node_selector == (("kubernetes.io/os", "linux"), ("pool", "cpu"))
    assert s.router_resources.manifest() == {"requests": {"cpu": "50m"}, "limits": {"memory": "1.5Gi"}}
    assert s.nvme_volume == "hostPath" and s.metrics_port == 9191 and s.metrics_host == "127.64.1.2"
    assert s.tolerations == ({"key": "a", "operator": "Exists"},)
    assert s.image_pull_secrets == ("regcred", "mirror.creds")


@pytest.mark.parametrize(
    ("key", "value", "fragment"),
    [
        ("nvme_volume", "tmpfs", "STRATA_NVME_VOLUME"),
        ("metrics_port", "-1", "STRATA_METRICS_PORT"),
        ("metrics_port", "x", "not a number"),
        ("metrics_host", "pod-ip", "STRATA_METRICS_HOST: 'pod-ip' is not an IP address"),
        ("peering_lifetime_s", "0", "positive"),
        ("tolerations", "{", "not JSON"),
        ("tolerations", '{"key": "a"}', "JSON list"),
        ("nvme_host_path", "relative/dir", "absolute"),
        ("image_pull_secrets", "regcred", "STRATA_IMAGE_PULL_SECRETS: not JSON"),
        ("image_pull_secrets", '{"name": "x"}', "JSON list"),
        ("image_pull_secrets", '["regcred"]', "is not"),
        ("image_pull_secrets", '[{"name": "Bad_Name"}]', "Bad_Name"),
        ("router_node_selector", "pool=cpu", "STRATA_ROUTER_NODE_SELECTOR: not JSON"),
        ("router_node_selector", '["pool"]', "JSON object"),
        ("router_node_selector", '{"pool": 1}', "value of 'pool' must be a string"),
        ("router_resources", '{"request": {}}', r"STRATA_ROUTER_RESOURCES: unknown key\(s\) \['request'\]"),
        ("router_resources", '{"requests": {"cpu": "lots"}}', "requests: cpu 'lots' is not a quantity"),
        ("router_resources", '{"limits": ["1Gi"]}', "limits: must be an object"),
        ("network_policy", "yes", "STRATA_NETWORK_POLICY: 'yes' is not true or false"),
        ("metrics_namespaces", "monitoring", "STRATA_METRICS_NAMESPACES: not JSON"),
        ("metrics_namespaces", '{"ns": 1}', "JSON list"),
        ("metrics_namespaces", '["Monitoring"]', "'Monitoring' is not a namespace name"),
    ],
)
def test_bad_values_are_refused_naming_the_setting(key, value, fragment):
    with pytest.raises(SettingsError, match=fragment):
        settings_from({key: value})


def test_flags_override_the_environment(monkeypatch):
    monkeypatch.setenv("STRATA_WORKER_IMAGE", "from-env:1")
    monkeypatch.setenv("STRATA_NVME_VOLUME", "hostPath")
    s = build_settings(parser().parse_args(["--worker-image", "from-flag:2"]))
    assert s.worker_image == "from-flag:2" and s.nvme_volume == "hostPath"
    s = build_settings(parser().parse_args(["--router-node-selector", '{"pool": "cpu"}']))
    assert s.router_node_selector == (("pool", "cpu"),)


@pytest.mark.parametrize(
    ("spec", "lo", "hi", "want"), [(3, 1, 5, 3), (0, 1, 5, 1), (9, 1, 5, 5), (0, 0, 2, 0)]
)
def test_desired_replicas_clamps(spec, lo, hi, want):
    assert desired_replicas(spec, lo, hi) == want


def test_desired_replicas_refuses_inverted_bounds():
    with pytest.raises(ValueError, match="minReplicas"):
        desired_replicas(1, 3, 2)
