"""How this cluster provides what services need: one frozen object, built from flags or env.

The InferenceService and its ServiceTier say *what* a service needs; these settings say *how*
this particular cluster provides it (worker image, whether local NVMe comes from a volume
provisioner or from a host directory, extra tolerations for GPU node taints, where the routers
run)."""

from __future__ import annotations

import ipaddress
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from strata.operator.api.base import DNS_LABEL, DNS_SUBDOMAIN
from strata.operator.api.quantity import QUANTITY_PATTERN
from strata.operator.autoscale.decide import UTILIZATION_WINDOW_S

NvmeVolumeMode = Literal["ephemeral", "hostPath"]
NVME_VOLUME_MODES: tuple[NvmeVolumeMode, ...] = ("ephemeral", "hostPath")
SECRET_NAME = re.compile(DNS_SUBDOMAIN)


class SettingsError(ValueError):
    """A setting has a value the operator cannot use; the message names the setting."""


@dataclass(frozen=True)
class Resources:
    """A container's requests and limits (a quantity per resource name), as a pod spells them."""

    requests: tuple[tuple[str, str], ...] = ()
    limits: tuple[tuple[str, str], ...] = ()

    def manifest(self) -> dict[str, dict[str, str]]:
        parts = (("requests", self.requests), ("limits", self.limits))
        return {name: dict(quantities) for name, quantities in parts if quantities}


# A router proxies and tokenizes; it holds no KV cache and needs no GPU.
ROUTER_RESOURCES = Resources(requests=(("cpu", "250m"), ("memory", "256Mi")), limits=(("memory", "1Gi"),))


@dataclass(frozen=True)
class OperatorSettings:
    worker_image: str = "ghcr.io/strata-dev/strata-worker:0.1.0"
    # The engine image of `engine.kind: vllm`: vLLM's OpenAI server with Strata installed beside
    # it for the KV connector (Dockerfile.vllm: vllm/vllm-openai plus `pip install strata`).
    vllm_image: str = "ghcr.io/strata-dev/strata-vllm:0.1.0"
    image_pull_policy: str = "IfNotPresent"
    # "ephemeral": a generic ephemeral volume (or claim template) with the tier's storage class;
    # "hostPath": a directory on the node, for clusters without a local-volume provisioner.
    nvme_volume: NvmeVolumeMode = "ephemeral"
    nvme_host_path: str = "/var/lib/strata/nvme"
    tolerations: tuple[Mapping[str, Any], ...] = ()
    # The routers' nodeSelector, as (label, value) pairs: routers need no GPU, and without one
    # the scheduler may put them on GPU nodes (or, in a test cluster, on nodes that run nothing).
    router_node_selector: tuple[tuple[str, str], ...] = ()
    router_resources: Resources = ROUTER_RESOURCES
    # Secret names for pulling the worker image; each must exist in every tenant namespace.
    image_pull_secrets: tuple[str, ...] = ()
    # How long a replica's peering record stays valid without a refresh: a killed active replica
    # is replaced by a standby after at most this long.
    peering_lifetime_s: int = 60
    metrics_port: int = 9090
    # The address the metrics server binds; the chart gives the pod IP (on the test cluster's
    # local pod runtime every pod shares the host's ports, and a Service's ClusterIP:port too).
    metrics_host: str = "0.0.0.0"
    uid: int = 10001
    # How often the autoscaler scrapes the workers, writes status.signals and decides.
    autoscale_interval_s: int = 15
    # How long the autoscaler averages prefill utilization over (one long prompt makes a single
    # interval spiky); shorter reacts sooner, up and down (the demo's act uses 30 s).
    utilization_window_s: int = int(UTILIZATION_WINDOW_S)
    # The API client: the shortest timeout of a request (it grows with the server's latency)
    # and how many requests may be in flight at once.
    api_timeout_s: int = 10
    api_max_in_flight: int = 32
    # Reconciles running at once (the rest wait their turn in order): enough to keep the API
    # client's in-flight limit busy, few enough that a burst does not hold a rendered copy of
    # every service's children in memory at once.
    reconcile_workers: int = 64
    # A NetworkPolicy per service: its workers take traffic only from its routers (and their
    # metrics ports from ``metrics_namespaces``); its routers from anyone on the serving port.
    network_policy: bool = True
    # Namespaces whose pods may scrape the workers' metrics ports: the operator's own (the
    # autoscaler) and Prometheus's. The chart gives its release namespace and its values'.
    metrics_namespaces: tuple[str, ...] = ()


_ENV = {
    "worker_image": "STRATA_WORKER_IMAGE",
    "vllm_image": "STRATA_VLLM_IMAGE",
    "image_pull_policy": "STRATA_IMAGE_PULL_POLICY",
    "nvme_volume": "STRATA_NVME_VOLUME",
    "nvme_host_path": "STRATA_NVME_HOST_PATH",
    "tolerations": "STRATA_TOLERATIONS",
    "router_node_selector": "STRATA_ROUTER_NODE_SELECTOR",
    "router_resources": "STRATA_ROUTER_RESOURCES",
    "image_pull_secrets": "STRATA_IMAGE_PULL_SECRETS",
    "peering_lifetime_s": "STRATA_PEERING_LIFETIME_S",
    "metrics_port": "STRATA_METRICS_PORT",
    "metrics_host": "STRATA_METRICS_HOST",
    "autoscale_interval_s": "STRATA_AUTOSCALE_INTERVAL_S",
    "utilization_window_s": "STRATA_UTILIZATION_WINDOW_S",
    "api_timeout_s": "STRATA_API_TIMEOUT_S",
    "api_max_in_flight": "STRATA_API_MAX_IN_FLIGHT",
    "reconcile_workers": "STRATA_RECONCILE_WORKERS",
    "network_policy": "STRATA_NETWORK_POLICY",
    "metrics_namespaces": "STRATA_METRICS_NAMESPACES",
}
NAMESPACE_NAME = re.compile(DNS_LABEL)


def settings_from(values: Mapping[str, str | None]) -> OperatorSettings:
    """Settings from string values keyed like the dataclass fields; unset keys keep defaults."""
    given = {k: v for k, v in values.items() if v is not None and v != ""}
    kwargs: dict[str, Any] = {}
    for key, raw in given.items():
        kwargs[key] = _convert(key, raw)
    return OperatorSettings(**kwargs)


def settings_from_env(environ: Mapping[str, str] | None = None) -> OperatorSettings:
    env = os.environ if environ is None else environ
    return settings_from({key: env.get(var) for key, var in _ENV.items()})


def env_name(key: str) -> str:
    return _ENV[key]


def _convert(key: str, raw: str) -> Any:
    if key not in _ENV:
        raise SettingsError(f"unknown operator setting {key!r}")
    if key == "nvme_volume":
        if raw not in NVME_VOLUME_MODES:
            raise SettingsError(f"{_ENV[key]}: {raw!r} is not one of {', '.join(NVME_VOLUME_MODES)}")
        return raw
    if key == "tolerations":
        return _tolerations(raw)
    if key == "image_pull_secrets":
        return _pull_secrets(raw)
    if key == "router_node_selector":
        return _node_selector(raw)
    if key == "router_resources":
        return _resources(raw)
    if key == "network_policy":
        return _boolean(key, raw)
    if key == "metrics_namespaces":
        return _namespaces(key, raw)
    if key in (
        "peering_lifetime_s",
        "metrics_port",
        "autoscale_interval_s",
        "utilization_window_s",
        "api_timeout_s",
        "api_max_in_flight",
        "reconcile_workers",
    ):
        return _positive_number(key, raw)
    if key == "metrics_host":
        return _address(key, raw)
    if key == "nvme_host_path" and not raw.startswith("/"):
        raise SettingsError(f"{_ENV[key]}: {raw!r} must be an absolute path")
    return raw


def _address(key: str, raw: str) -> str:
    try:
        return str(ipaddress.ip_address(raw))
    except ValueError:
        raise SettingsError(f"{_ENV[key]}: {raw!r} is not an IP address") from None


def _boolean(key: str, raw: str) -> bool:
    if raw.lower() not in ("true", "false"):
        raise SettingsError(f"{_ENV[key]}: {raw!r} is not true or false")
    return raw.lower() == "true"


def _namespaces(key: str, raw: str) -> tuple[str, ...]:
    """``["monitoring", "strata-system"]``, as the chart's values spell it."""
    var = _ENV[key]
    parsed = _json(var, raw)
    if not isinstance(parsed, list):
        raise SettingsError(f'{var}: must be a JSON list like ["monitoring"]')
    for name in parsed:
        if not isinstance(name, str) or not NAMESPACE_NAME.match(name):
            raise SettingsError(f"{var}: {name!r} is not a namespace name")
    return tuple(sorted(set(parsed)))


def _positive_number(key: str, raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise SettingsError(f"{_ENV[key]}: {raw!r} is not a number") from None
    if value <= 0:
        raise SettingsError(f"{_ENV[key]}: must be positive, got {raw!r}")
    return value


def _json(var: str, raw: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise SettingsError(f"{var}: not JSON ({exc.msg})") from None


def _tolerations(raw: str) -> tuple[Mapping[str, Any], ...]:
    parsed = _json(_ENV["tolerations"], raw)
    if not isinstance(parsed, list) or not all(isinstance(t, dict) for t in parsed):
        raise SettingsError(f"{_ENV['tolerations']}: must be a JSON list of toleration objects")
    return tuple(parsed)


def _pull_secrets(raw: str) -> tuple[str, ...]:
    """``[{"name": "regcred"}]``, as a pod's imagePullSecrets (and the chart's values) spell it."""
    var = _ENV["image_pull_secrets"]
    parsed = _json(var, raw)
    if not isinstance(parsed, list):
        raise SettingsError(f'{var}: must be a JSON list like [{{"name": "regcred"}}]')
    names: list[str] = []
    for item in parsed:
        name = item.get("name") if isinstance(item, dict) else None
        if not isinstance(name, str) or not SECRET_NAME.match(name):
            raise SettingsError(f'{var}: {item!r} is not {{"name": <Secret name>}}')
        names.append(name)
    return tuple(names)


def _json_object(var: str, raw: str, example: str) -> dict[str, Any]:
    parsed = _json(var, raw)
    if not isinstance(parsed, dict):
        raise SettingsError(f"{var}: must be a JSON object like {example}")
    return parsed


def _node_selector(raw: str) -> tuple[tuple[str, str], ...]:
    """``{"label": "value", ...}``, as a pod's nodeSelector (and the chart's values) spell it."""
    var = _ENV["router_node_selector"]
    parsed = _json_object(var, raw, '{"pool": "cpu"}')
    for label, value in parsed.items():
        if not isinstance(value, str):
            raise SettingsError(f"{var}: the value of {label!r} must be a string, got {value!r}")
    return tuple(sorted(parsed.items()))


def _resources(raw: str) -> Resources:
    """``{"requests": {"cpu": "250m"}, "limits": {"memory": "1Gi"}}``, as a container spells it."""
    var = _ENV["router_resources"]
    parsed = _json_object(var, raw, '{"requests": {"cpu": "250m"}}')
    unknown = sorted(set(parsed) - {"requests", "limits"})
    if unknown:
        raise SettingsError(f"{var}: unknown key(s) {unknown}; only requests and limits")
    parts = {part: _quantities(f"{var}: {part}", parsed.get(part) or {}) for part in ("requests", "limits")}
    return Resources(**parts)


def _quantities(where: str, given: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(given, dict):
        raise SettingsError(f"{where}: must be an object of quantities, got {given!r}")
    for name, value in given.items():
        if not isinstance(value, str) or not re.match(QUANTITY_PATTERN, value):
            raise SettingsError(f"{where}: {name} {value!r} is not a quantity such as '250m' or '1Gi'")
    return tuple(sorted(given.items()))
