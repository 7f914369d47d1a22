"""The tenant walls on the real control plane, as tenant B or anyone outside would try them.

One service (the ``tiny`` model on the local node, a real worker pod with its KV-tier sidecar and
a real router) in a namespace labelled ``pod-security.kubernetes.io/enforce=restricted``, with an
HF token and an API key from Secrets. Then:

- the API server's own PodSecurity admission admits every pod the operator renders (and refuses
  a hostPath pod in the same namespace: the check is really on);
- the API key is required at the router and at the worker: 401 in OpenAI's shape without it or
  with a wrong one, 200 with it;
- the service's NetworkPolicies are accepted, and the API server's own label selection picks
  exactly the worker pods, their routers, and the routers (no CNI here enforces them);
- after requests, neither Secret value appears in any container's or component's log, the
  operator's log, any Event, the InferenceService or its ConfigMap.
"""

from __future__ import annotations

import base64
import json
import secrets
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from strata.cluster import Cluster
from strata.cluster.nodes import POD_RUNTIME_LABEL, POD_RUNTIME_LOCAL
from strata.common.endpoints import WORKER_PORT
from strata.operator import names
from strata.stack import (
    SYSTEM_NAMESPACE,
    OperatorProcess,
    get,
    inference_service,
    items,
    local_pods_env,
    local_resources,
    operator_running,
    wait_for,
    wait_ready,
)
from strata.stack.serving import loopback_ip, ready_worker_pods, router_url

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(2400)]
READY_S = 900.0  # importing torch and loading the model on a loaded two-core machine
SERVICE = "chat"
RESTRICTED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
}


@dataclass(frozen=True)
class Tenant:
    namespace: str
    api_key: str
    hf_token: str
    operator_log: Path


@pytest.fixture(scope="module")
def operator(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    """The operator on the test cluster's hostPath NVMe, its routers on the local node."""
    directory = tmp_path_factory.mktemp("walls")
    env = {
        **local_pods_env(directory / "nvme"),
        "STRATA_ROUTER_NODE_SELECTOR": json.dumps({POD_RUNTIME_LABEL: POD_RUNTIME_LOCAL}),
        "STRATA_ROUTER_RESOURCES": json.dumps({"requests": {"cpu": "50m", "memory": "256Mi"}}),
        "STRATA_METRICS_NAMESPACES": json.dumps([SYSTEM_NAMESPACE]),
    }
    with operator_running(cluster, directory / "operator.log", env=env) as process:
        yield process


@pytest.fixture(scope="module")
def tenant(cluster: Cluster, operator: OperatorProcess) -> Iterator[Tenant]:
    """A restricted namespace with its two Secrets and a service that uses both, Ready."""
    namespace = f"walls-{secrets.token_hex(3)}"
    cluster.apply(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace, "labels": RESTRICTED}}
    )
    given = Tenant(
        namespace, f"sk-wall-{secrets.token_hex(12)}", f"hf_wall{secrets.token_hex(12)}", operator.log
    )
    try:
        create_secret(cluster, namespace, "api-key", given.api_key)
        create_secret(cluster, namespace, "hf-token", given.hf_token)
        cluster.apply(service(), namespace)
        ready_worker_pods(cluster, namespace, SERVICE, 1, READY_S)
        wait_ready(cluster, namespace, SERVICE, timeout_s=READY_S)
        yield given
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", "--ignore-not-found", check=False)


def create_secret(cluster: Cluster, namespace: str, name: str, value: str) -> None:
    encoded = base64.b64encode(value.encode()).decode()
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "data": {"value": encoded}}
    cluster.apply(secret, namespace)


def from_secret(variable: str, secret: str) -> dict[str, Any]:
    return {"name": variable, "valueFrom": {"secretKeyRef": {"name": secret, "key": "value"}}}


def service() -> dict[str, Any]:
    env = [from_secret("HF_TOKEN", "hf-token"), from_secret("STRATA_API_KEY", "api-key")]
    spec = {
        "replicas": 1,
        "resources": local_resources("250m", "1Gi"),
        "cache": {"dram": "64Mi", "nvme": "256Mi"},
    }
    return inference_service(SERVICE, "standard", pod={"env": env}, **spec)


def pods(cluster: Cluster, namespace: str, selector: dict[str, str] | None = None) -> set[str]:
    """Pod names as the API server's own label selection returns them."""
    chosen = names.label_selector(selector) if selector is not None else ""
    return {p["metadata"]["name"] for p in items(cluster, "pods", namespace, chosen)}


def owned_pods(cluster: Cluster, namespace: str) -> dict[str, set[str]]:
    """The namespace's pods by the workload that owns them (ReplicaSet -> Deployment), not by label."""
    deployment_of = {
        rs["metadata"]["name"]: rs["metadata"]["ownerReferences"][0]["name"]
        for rs in items(cluster, "replicasets", namespace)
    }
    owners: dict[str, set[str]] = {}
    for pod in items(cluster, "pods", namespace):
        (ref,) = pod["metadata"]["ownerReferences"]
        owner = deployment_of.get(ref["name"], ref["name"]) if ref["kind"] == "ReplicaSet" else ref["name"]
        owners.setdefault(owner, set()).add(pod["metadata"]["name"])
    return owners


def call(url: str, key: str | None, body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    if key is not None:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=120) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def completion() -> dict[str, Any]:
    return {"model": "tiny", "prompt": "The walls between tenants", "max_tokens": 4}


def test_every_pod_the_operator_renders_is_admitted_as_restricted(cluster: Cluster, tenant: Tenant) -> None:
    labels = get(cluster, "namespace", tenant.namespace)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    owners = owned_pods(cluster, tenant.namespace)
    assert set(owners) == {SERVICE, names.router_name(SERVICE)}
    assert len(owners[names.router_name(SERVICE)]) == 2 and owners[SERVICE]
    refused = [e for e in items(cluster, "events", tenant.namespace) if e.get("reason") == "FailedCreate"]
    assert refused == [], [e.get("message") for e in refused]
    worker = get(cluster, "pod", sorted(owners[SERVICE])[0], tenant.namespace)
    assert {"name": "nvme", "emptyDir": {}} in worker["spec"]["volumes"]  # not the operator's hostPath
    host_path = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "host-path"},
        "spec": {
            "containers": [{"name": "c", "image": "x", "command": ["true"]}],
            "volumes": [{"name": "h", "hostPath": {"path": "/var/lib/strata/nvme"}}],
        },
    }
    done = cluster.kubectl(
        "apply", "-n", tenant.namespace, "-f", "-", input=json.dumps(host_path), check=False
    )
    assert done.returncode != 0 and "violates PodSecurity" in done.stderr, done.stderr


def test_the_api_key_is_required_at_the_router_and_at_the_worker(cluster: Cluster, tenant: Tenant) -> None:
    base = wait_for(lambda: router_url(cluster, tenant.namespace, SERVICE), 300, what="a router to answer")
    (worker,) = ready_worker_pods(cluster, tenant.namespace, SERVICE, 1, READY_S)
    direct = f"http://{loopback_ip(worker)}:{WORKER_PORT}/v1"
    for api in (base, direct):
        for key in (None, "wrong", tenant.api_key[:-1]):
            status, body = call(f"{api}/completions", key, completion())
            assert status == 401 and body["error"]["type"] == "authentication_error", (api, key, body)
        for _ in range(3):
            status, body = call(f"{api}/completions", tenant.api_key, completion())
            assert status == 200 and body["choices"][0]["text"], body
        assert call(f"{api}/models", tenant.api_key)[0] == 200


def test_the_network_policies_are_accepted_and_select_exactly_their_pods(
    cluster: Cluster, tenant: Tenant
) -> None:
    ns = tenant.namespace
    policies = {p["metadata"]["name"]: p["spec"] for p in items(cluster, "networkpolicies", ns)}
    assert set(policies) == {SERVICE, names.router_name(SERVICE)}
    owners = owned_pods(cluster, ns)
    workers, routers = owners[SERVICE], owners[names.router_name(SERVICE)]
    worker_policy, router_policy = policies[SERVICE], policies[names.router_name(SERVICE)]
    assert pods(cluster, ns, worker_policy["podSelector"]["matchLabels"]) == workers
    from_routers, from_scrapers = worker_policy["ingress"]
    assert pods(cluster, ns, from_routers["from"][0]["podSelector"]["matchLabels"]) == routers
    assert from_scrapers["from"][0]["namespaceSelector"]["matchExpressions"][0]["values"] == [
        SYSTEM_NAMESPACE
    ]
    assert pods(cluster, ns, router_policy["podSelector"]["matchLabels"]) == routers
    worker = get(cluster, "pod", sorted(workers)[0], ns)["spec"]
    served = {
        p["containerPort"]
        for c in [*worker["containers"], *worker["initContainers"]]
        for p in c.get("ports", [])
    }
    assert {p["port"] for p in from_routers["ports"]} == served
    assert "from" not in router_policy["ingress"][0]


def test_no_secret_value_appears_in_a_log_an_event_or_a_status(cluster: Cluster, tenant: Tenant) -> None:
    base = wait_for(lambda: router_url(cluster, tenant.namespace, SERVICE), 300, what="a router to answer")
    for key in (tenant.api_key, "wrong"):
        call(f"{base}/completions", key, completion())  # a success and a refusal, both logged
    values = [tenant.api_key, tenant.hf_token]
    values += [base64.b64encode(v.encode()).decode() for v in values]
    places = {
        str(p): p.read_text(errors="replace") for p in (cluster.directory / "logs").rglob("*") if p.is_file()
    }
    assert any(f"/logs/pods/{tenant.namespace}_" in p for p in places)  # the service's containers' too
    places["operator log"] = tenant.operator_log.read_text(errors="replace")
    places["events"] = cluster.kubectl("get", "events", "-A", "-o", "json").stdout
    places["inferenceservice"] = json.dumps(get(cluster, "inferenceservice", SERVICE, tenant.namespace))
    places["configmaps"] = json.dumps(items(cluster, "configmaps", tenant.namespace))
    places["operator namespace"] = cluster.kubectl("get", "all", "-n", SYSTEM_NAMESPACE, "-o", "json").stdout
    leaks = [(where, value[:8]) for where, text in places.items() for value in values if value in text]
    assert leaks == [], f"secret values found in: {leaks}"
