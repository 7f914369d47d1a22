"""Rendering the router: its config (what the workers hash and validate with), its Deployment and
PDB, and the least privilege it runs with, which the operator must itself hold to grant."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from strata.common.routermemory import followed_limit
from strata.operator import names
from strata.operator.render.configmap import render_configmap
from strata.operator.render.router import POD_READER_RULES, render_router
from strata.operator.render.workload import render_workload
from strata.operator.resolve import ResolveInput, resolve
from strata.operator.settings import OperatorSettings, Resources
from strata.router.config import HoldConfig, RouterConfig
from strata.router.discovery import pod_state
from strata.worker.kv_connector import root_hash

from .factories import NS_UID, isvc_body, tier_body

ROOT = Path(__file__).resolve().parents[2]


def plan_of(tier: str = "standard", source: dict[str, Any] | None = None, **spec):
    body = isvc_body(tier=tier, **spec)
    if source is not None:
        body["spec"]["model"]["source"] = source
    return resolve(ResolveInput(body, tier_body(tier), NS_UID))


def by_kind(plan) -> dict[str, Any]:
    return {m["kind"]: m for m in render_router(plan, OperatorSettings())}


def test_the_router_config_lives_in_the_services_configmap_and_matches_the_workers():
    plan = plan_of("premium", engine={"blockSize": 32})
    data = render_configmap(plan)["data"]
    router = RouterConfig.from_yaml(data[names.ROUTER_CONFIG_FILE])
    worker = plan.worker
    assert router.model.name == worker.model.name and router.block_size == 32 == worker.engine.block_size
    # the same salt, so the router's block hashes are the workers'
    assert root_hash(router.cache_namespace, router.model.name, router.block_size) == root_hash(
        worker.cache_namespace, worker.model.name, worker.engine.block_size
    )
    assert router.model.max_context_tokens == worker.model.max_context_tokens
    assert router.priority.default == router.priority.max == 1_000_000 and router.priority.min == 0
    assert router.queue.ttl_s == worker.engine.queue_timeout_s == 30
    assert router.workers.kv_events_port == worker.kvtier.metrics_port


def test_the_router_watches_exactly_the_services_worker_pods():
    plan = plan_of()
    router = plan.router
    selector = dict(kv.split("=") for kv in router.workers.label_selector.split(","))
    labels = render_workload(plan, OperatorSettings())["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= labels.items()
    router_labels = by_kind(plan)["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert not selector.items() <= router_labels.items()  # never routes to itself
    pod = {"metadata": {"name": "chat-0"}, "status": {"podIP": "127.64.0.9", "conditions": []}}
    assert pod_state(pod, router.workers).address.url == f"http://127.64.0.9:{plan.worker.server.port}"  # type: ignore[union-attr]


def test_a_tiers_queue_ttl_reaches_router_and_workers():
    body = isvc_body()
    tier = tier_body("batch", routing={"queueTtlSeconds": 120})
    plan = resolve(ResolveInput(body, tier, NS_UID))
    assert plan.router.queue.ttl_s == 120 == plan.worker.engine.queue_timeout_s
    assert plan.router.priority.default == 1000


def test_a_tiers_hold_limits_reach_the_router_and_default_to_the_routers_own():
    plan = resolve(ResolveInput(isvc_body(), tier_body("batch"), NS_UID))
    assert plan.router.hold == HoldConfig()
    tier = tier_body("batch", routing={"holdTimeoutSeconds": 900, "holdMaxRequests": 32})
    plan = resolve(ResolveInput(isvc_body(), tier, NS_UID))
    assert (plan.router.hold.timeout_s, plan.router.hold.max_requests) == (900, 32)


def test_two_hardened_replicas_with_a_pdb_and_a_pod_reading_role():
    plan = plan_of()
    kinds = by_kind(plan)
    deployment = kinds["Deployment"]
    assert deployment["metadata"]["name"] == "chat-router" and deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"][:3] == ["strata", "router", "serve"]
    # It listens on its pod IP, as the workers do (pods share a host on the local pod runtime).
    assert container["args"] == ["--host=$(POD_IP)"]
    env = [e["name"] for e in container["env"]]
    assert env.count("POD_IP") == 1 and len(env) == len(set(env))
    assert container["securityContext"]["readOnlyRootFilesystem"] and pod["securityContext"]["runAsNonRoot"]
    assert pod["serviceAccountName"] == "chat-router" and pod["automountServiceAccountToken"]
    assert kinds["PodDisruptionBudget"]["spec"]["minAvailable"] == 1
    assert kinds["Role"]["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}]
    assert kinds["RoleBinding"]["subjects"] == [
        {"kind": "ServiceAccount", "name": "chat-router", "namespace": "team-a"}
    ]
    assert kinds["RoleBinding"]["roleRef"]["name"] == "chat-router"
    json.dumps(list(kinds.values()))
    for manifest in kinds.values():
        assert manifest["metadata"]["ownerReferences"][0]["uid"] == "uid-chat"


@pytest.mark.parametrize(
    ("source", "volume", "init"),
    [
        ({"builtin": "tiny"}, None, False),
        ({"uri": "hf://org/m"}, "emptyDir", True),
        ({"pvc": {"claimName": "w"}}, "persistentVolumeClaim", False),
    ],
)
def test_the_router_reads_the_models_tokenizer_where_the_model_is(source, volume, init):
    plan = plan_of(source=source)
    pod = by_kind(plan)["Deployment"]["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    if volume is None:
        assert (
            "model" not in volumes and plan.router.model.path is None and plan.router.model.vocab_size == 320
        )
    else:
        assert volume in volumes["model"] and plan.router.model.path == plan.worker.model.path
    assert ("initContainers" in pod) == init
    for container in pod["containers"] + pod.get("initContainers", []):
        mounted = {m["name"] for m in container["volumeMounts"]}
        assert mounted <= set(volumes)


def test_routers_tolerate_what_the_cluster_asks_but_never_take_a_gpu_node():
    local = {"key": "strata.dev/pod-runtime", "operator": "Equal", "value": "local", "effect": "NoSchedule"}
    deployment = render_router(plan_of(), OperatorSettings(tolerations=(local,)))[-1]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["tolerations"] == [local]
    assert "nvidia.com/gpu" not in json.dumps(pod)


def test_routers_run_at_their_tiers_priority_so_their_own_workers_cannot_preempt_them():
    for tier in ("premium", "batch"):
        plan = plan_of(tier)
        router = by_kind(plan)["Deployment"]["spec"]["template"]["spec"]
        worker = render_workload(plan, OperatorSettings())["spec"]["template"]["spec"]
        assert router["priorityClassName"] == worker["priorityClassName"] == names.priority_class_name(tier)


def test_the_config_change_rolls_the_router_pods():
    first = by_kind(plan_of())["Deployment"]["spec"]["template"]["metadata"]["annotations"]
    other = by_kind(plan_of(engine={"blockSize": 32}))["Deployment"]["spec"]["template"]["metadata"][
        "annotations"
    ]
    assert first[names.ANNOTATION_CONFIG_HASH] != other[names.ANNOTATION_CONFIG_HASH]


def test_the_operator_holds_everything_it_grants_the_router():
    """RBAC escalation prevention: a Role can only be created by someone holding its rights."""
    text = (ROOT / "charts" / "strata" / "templates" / "rbac.yaml").read_text()
    rules_block = text.split("rules:", 1)[1].split("---", 1)[0]
    body = "\n".join(line for line in rules_block.splitlines() if "{{" not in line)
    held = yaml.safe_load(body)
    for granted in POD_READER_RULES:
        assert any(
            set(granted["apiGroups"]) <= set(rule["apiGroups"])
            and set(granted["resources"]) <= set(rule["resources"])
            and set(granted["verbs"]) <= set(rule["verbs"])
            for rule in held
        ), granted
    writes = {
        (g, r)
        for rule in held
        for g in rule["apiGroups"]
        for r in rule["resources"]
        if "create" in rule["verbs"]
    }
    assert {
        ("", "serviceaccounts"),
        ("rbac.authorization.k8s.io", "roles"),
        ("rbac.authorization.k8s.io", "rolebindings"),
    } <= writes


def test_the_router_gets_the_workers_api_key_and_no_other_tenant_secret():
    key = {"name": "STRATA_API_KEY", "valueFrom": {"secretKeyRef": {"name": "api", "key": "key"}}}
    hf = {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}}
    pod = {"env": [hf, key], "envFrom": [{"secretRef": {"name": "more"}}]}
    (container,) = by_kind(plan_of(pod=pod))["Deployment"]["spec"]["template"]["spec"]["containers"]
    assert [e["name"] for e in container["env"]] == ["POD_NAME", "POD_NAMESPACE", "POD_IP", "STRATA_API_KEY"]
    ref = container["env"][-1]["valueFrom"]["secretKeyRef"]
    assert (ref["name"], ref["key"]) == ("api", "key") and "envFrom" not in container
    (open_router,) = by_kind(plan_of())["Deployment"]["spec"]["template"]["spec"]["containers"]
    assert "STRATA_API_KEY" not in {e["name"] for e in open_router["env"]}


def test_routers_go_where_the_settings_select_and_anywhere_without():
    selector = (("strata.dev/pod-runtime", "local"),)
    placed = render_router(plan_of(), OperatorSettings(router_node_selector=selector))[-1]
    assert placed["spec"]["template"]["spec"]["nodeSelector"] == {"strata.dev/pod-runtime": "local"}
    anywhere = render_router(plan_of(), OperatorSettings())[-1]
    assert "nodeSelector" not in anywhere["spec"]["template"]["spec"]


def test_router_resources_come_from_the_settings():
    default = render_router(plan_of(), OperatorSettings())[-1]["spec"]["template"]["spec"]["containers"][0]
    assert default["resources"] == {
        "requests": {"cpu": "250m", "memory": "256Mi"},
        "limits": {"memory": "1Gi"},
    }
    small = OperatorSettings(router_resources=Resources(requests=(("cpu", "50m"),)))
    container = render_router(plan_of(), small)[-1]["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"] == {"requests": {"cpu": "50m"}}


def router_container(plan, settings: OperatorSettings | None = None) -> dict[str, Any]:
    deployment = render_router(plan, settings or OperatorSettings())[-1]
    container: dict[str, Any] = deployment["spec"]["template"]["spec"]["containers"][0]
    return container


def test_routers_of_a_service_whose_block_size_is_known_get_the_memory_to_follow_every_block():
    # Llama-3-8B (128 KiB a token, 2 MiB blocks) at the premium tier's largest sizes, 8 replicas:
    # 8 x (65,536 DRAM + 524,288 NVMe + 100,000 record) + 256,000 shared = 5,774,592 keys, at
    # 160 bytes each in half the memory: 1,847,869,440 bytes, 1,763 MiB rounded up.
    big = {"dram": "128Gi", "nvme": "1Ti", "shared": True}
    plan = plan_of("premium", model={"kvBytesPerToken": 131072}, cache=big, maxReplicas=8)
    assert plan.router_memory_bytes == 1763 * 2**20
    resources = router_container(plan)["resources"]
    assert resources == {"requests": {"cpu": "250m", "memory": "1763Mi"}, "limits": {"memory": "1763Mi"}}
    # The routers then follow all of it (router/view.py's own arithmetic).
    assert (followed_limit(plan.router_memory_bytes) or 0) >= 5_774_592


def test_a_small_service_or_an_unknown_block_size_keeps_the_charts_router_resources():
    small = plan_of("premium", model={"kvBytesPerToken": 131072}, maxReplicas=1)
    assert small.router_memory_bytes is not None and small.router_memory_bytes < 2**30
    unknown = plan_of("premium", cache={"dram": "128Gi", "nvme": "1Ti", "shared": True}, maxReplicas=8)
    assert unknown.router_memory_bytes is None
    for plan in (small, unknown):
        assert router_container(plan)["resources"] == {
            "requests": {"cpu": "250m", "memory": "256Mi"},
            "limits": {"memory": "1Gi"},
        }
    # A chart without a memory limit: the routers follow everything already.
    unlimited = OperatorSettings(router_resources=Resources(requests=(("cpu", "50m"),)))
    big = plan_of("premium", model={"kvBytesPerToken": 12288}, cache={"nvme": "1Ti"}, maxReplicas=8)
    assert router_container(big, unlimited)["resources"] == {"requests": {"cpu": "50m"}}
