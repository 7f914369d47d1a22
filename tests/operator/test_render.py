"""Rendering: every child of a service, for each tier and option combination."""

from __future__ import annotations

import itertools
import json

import pytest
import yaml

from strata.common.kvbudget import (
    INDEX_BYTES_PER_BLOCK,
    KVTIER_STAGING_BYTES,
    asked_blocks,
    fit,
    fixed_bytes,
    slot_bytes_for,
    staging_slots_for,
)
from strata.operator import names
from strata.operator.api.quantity import parse_size
from strata.operator.plan import OwnerRef
from strata.operator.render.configmap import config_hash, render_configmap
from strata.operator.render.pdb import max_unavailable, render_pdb
from strata.operator.render.pod import GPU_RESOURCE, SIDECAR_STOP_S, render_pod_template
from strata.operator.render.priorityclass import render_priorityclass
from strata.operator.render.services import render_client_service, render_metrics_service
from strata.operator.render.storage import render_shared_claim
from strata.operator.render.volumes import SHM_HEADROOM_BYTES
from strata.operator.render.workload import render_workload
from strata.operator.resolve import GENERATION_BUDGET_S, SIDECAR_MEMORY_OVERHEAD_BYTES, ResolveInput, resolve
from strata.operator.settings import OperatorSettings
from strata.worker.config import DRAIN_CUTOFF_S, WorkerConfig

from .factories import NS_UID, isvc_body, tier_body

TIERS = ("premium", "standard", "batch")
MODES = ("ephemeral", "hostPath")
SOURCES = (
    {"builtin": "tiny"},
    {"uri": "hf://org/model"},
    {"pvc": {"claimName": "weights", "path": "m"}},
)


def make(tier="standard", mode="ephemeral", source=None, storage_class=None, **spec):
    overrides = {"cache": {"nvme": {"storageClassName": storage_class}}} if storage_class else {}
    body = isvc_body(tier=tier, **spec)
    if source is not None:
        body["spec"]["model"]["source"] = source
    plan = resolve(ResolveInput(body, tier_body(tier, **overrides), NS_UID))
    return plan, OperatorSettings(nvme_volume=mode, nvme_host_path="/mnt/nvme")


def volumes_by_name(pod):
    return {v["name"]: v for v in pod["spec"]["volumes"]}


def containers(pod):
    return pod["spec"]["containers"] + pod["spec"].get("initContainers", [])


@pytest.mark.parametrize(("tier", "mode", "source"), list(itertools.product(TIERS, MODES, SOURCES)))
def test_every_combination_renders_a_hardened_schedulable_pod(tier, mode, source):
    plan, settings = make(tier, mode, source)
    workload = render_workload(plan, settings)
    json.dumps(workload)  # plain data only
    pod = workload["spec"]["template"]
    spec = pod["spec"]
    assert spec["priorityClassName"] == f"strata-{tier}"
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["automountServiceAccountToken"] is False
    for c in containers(pod):
        sc = c["securityContext"]
        assert sc["readOnlyRootFilesystem"] and sc["capabilities"] == {"drop": ["ALL"]}
        assert sc["allowPrivilegeEscalation"] is False and sc["runAsNonRoot"]
    assert spec["nodeSelector"] == {
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "strata.dev/local-nvme": "true",
    }
    assert workload["spec"]["selector"]["matchLabels"] == names.selector_labels("chat")
    assert pod["metadata"]["labels"][names.LABEL_TIER] == tier


@pytest.mark.parametrize("tier", TIERS)
def test_engine_requests_gpus_and_probes_the_worker(tier):
    plan, settings = make(tier)
    engine = render_pod_template(plan, settings)["spec"]["containers"][0]
    assert engine["resources"]["requests"][GPU_RESOURCE] == engine["resources"]["limits"][GPU_RESOURCE] == "1"
    assert engine["resources"]["requests"]["memory"] == engine["resources"]["limits"]["memory"] == "32Gi"
    assert "cpu" not in engine["resources"]["limits"]
    assert engine["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}
    assert engine["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert engine["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
    assert engine["command"] == ["strata", "worker", "serve", "--config", "/etc/strata/worker.yaml"]
    assert engine["args"] == ["--host=$(POD_IP)"]  # listen on the pod IP only
    pod_ip = {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
    assert pod_ip in engine["env"]


@pytest.mark.parametrize("tier", TIERS)
def test_grace_period_covers_the_worker_drain_and_the_sidecar_stop(tier):
    plan, settings = make(tier)
    server, engine = plan.worker.server, plan.worker.engine
    # The drain waits out a queued request's queue timeout, then its generation.
    assert server.drain_timeout_s == engine.queue_timeout_s + GENERATION_BUDGET_S
    grace = render_pod_template(plan, settings)["spec"]["terminationGracePeriodSeconds"]
    assert isinstance(grace, int)
    assert grace >= server.drain_timeout_s + DRAIN_CUTOFF_S + SIDECAR_STOP_S
    assert grace < server.drain_timeout_s + DRAIN_CUTOFF_S + SIDECAR_STOP_S + 1


def test_kvtier_is_a_native_sidecar_after_the_model_fetcher():
    plan, settings = make("premium")
    init = render_pod_template(plan, settings)["spec"]["initContainers"]
    assert [c["name"] for c in init] == ["model", "kvtier"]
    fetch, sidecar = init
    assert "restartPolicy" not in fetch and sidecar["restartPolicy"] == "Always"
    assert sidecar["command"] == ["strata", "kvtier", "serve", "--config", "/etc/strata/worker.yaml"]
    assert sidecar["args"] == ["--host=$(POD_IP)"]
    assert sidecar["readinessProbe"]["httpGet"]["port"] == "kv-metrics"
    assert fetch["command"][3:5] == ["--source", "builtin://tiny"]
    # The DRAM tier lives in the sidecar's memory: its limit covers it, the staging slots, the
    # fixed overhead and the NVMe tier's index (1/1024 of its 200Gi); the sidecar fits its
    # indexes within the same.
    assert sidecar["resources"]["limits"]["memory"] == "33736Mi"  # 32Gi + 256Mi + 512Mi + 200Mi
    assert plan.worker.kvtier.memory_bytes == 33736 * 2**20


# KV bytes a token: Qwen2.5-0.5B, Qwen2.5-7B, Llama-3-8B, Llama-3-70B (bfloat16).
KV_BYTES_PER_TOKEN = (12288, 57344, 131072, 327680)


@pytest.mark.parametrize("per_token", KV_BYTES_PER_TOKEN)
def test_a_model_whose_kv_bytes_per_token_are_given_gets_a_sidecar_that_indexes_every_block(per_token):
    plan, settings = make("premium", model={"kvBytesPerToken": per_token}, cache={"shared": True})
    kvtier = plan.worker.kvtier
    limit = kvtier.memory_bytes
    assert limit is not None and kvtier.shared.capacity_bytes > 0
    assert plan.worker.model.kv_bytes_per_token == per_token  # the engine checks it at its start
    block = per_token * plan.worker.engine.block_size
    assert not sidecar_fit(kvtier, block, limit).clipped
    sidecar = render_pod_template(plan, settings)["spec"]["initContainers"][1]
    assert sidecar["resources"]["limits"]["memory"] == sidecar["resources"]["requests"]["memory"]
    assert parse_size(sidecar["resources"]["limits"]["memory"]) >= limit
    # Never less than the DRAM tier, the staging slots and the overhead, as without the figure.
    least = kvtier.dram.capacity_bytes + KVTIER_STAGING_BYTES + SIDECAR_MEMORY_OVERHEAD_BYTES
    assert limit >= least


def test_without_the_figure_a_small_models_shared_index_is_fitted_and_with_it_it_is_not():
    block = KV_BYTES_PER_TOKEN[0] * 16
    unhinted, _ = make("premium", cache={"shared": True})
    hinted, _ = make("premium", model={"kvBytesPerToken": KV_BYTES_PER_TOKEN[0]}, cache={"shared": True})
    assert unhinted.worker.kvtier.memory_bytes is not None and hinted.worker.kvtier.memory_bytes is not None
    fitted = sidecar_fit(unhinted.worker.kvtier, block, unhinted.worker.kvtier.memory_bytes)
    assert fitted.fitted.shared < fitted.asked.shared
    assert hinted.worker.kvtier.memory_bytes > unhinted.worker.kvtier.memory_bytes
    # needed_bytes is tight: a block's index less and the shared tier gives way.
    tight = sidecar_fit(
        hinted.worker.kvtier, block, hinted.worker.kvtier.memory_bytes - INDEX_BYTES_PER_BLOCK
    )
    assert tight.fitted.shared == tight.asked.shared - 1


def sidecar_fit(kvtier, block_bytes, limit):
    """What the sidecar's own fit keeps within ``limit`` for the model's blocks (Assembly.fit_memory)."""
    slot = slot_bytes_for(block_bytes)
    asked = asked_blocks(kvtier, block_bytes)
    return fit(asked, limit, fixed_bytes(kvtier, asked, slot, staging_slots_for(slot)), slot)


@pytest.mark.parametrize(
    ("engine", "fetcher"),
    [
        ({"cpu": "100m", "memory": "512Mi"}, {"cpu": "100m", "memory": "512Mi"}),  # a small worker
        ({"cpu": "8", "memory": "64Gi"}, {"cpu": "500m", "memory": "1Gi"}),  # a download needs no more
    ],
)
def test_the_model_download_never_asks_more_than_the_engine(engine, fetcher):
    plan, settings = make(resources={"gpus": 1, **engine})
    fetch = render_pod_template(plan, settings)["spec"]["initContainers"][0]
    assert fetch["name"] == "model" and fetch["resources"]["requests"] == fetcher


def test_pvc_model_needs_no_fetcher_and_is_read_only():
    plan, settings = make(source={"pvc": {"claimName": "weights", "path": "m"}})
    pod = render_pod_template(plan, settings)
    assert [c["name"] for c in pod["spec"]["initContainers"]] == ["kvtier"]
    assert volumes_by_name(pod)["model"] == {
        "name": "model",
        "persistentVolumeClaim": {"claimName": "weights", "readOnly": True},
    }
    mount = next(m for m in pod["spec"]["containers"][0]["volumeMounts"] if m["name"] == "model")
    assert mount == {"name": "model", "mountPath": "/models", "readOnly": True, "subPath": "m"}


@pytest.mark.parametrize("tier", TIERS)
def test_shm_is_memory_backed_and_sized_to_the_dram_tier(tier):
    plan, settings = make(tier)
    shm = volumes_by_name(render_pod_template(plan, settings))["shm"]["emptyDir"]
    assert shm["medium"] == "Memory"
    dram = {"premium": 32, "standard": 16, "batch": 8}[tier] * 2**30
    size = dram + KVTIER_STAGING_BYTES + SHM_HEADROOM_BYTES  # the sidecar's staging slots beside it
    assert shm["sizeLimit"] == f"{size // 2**20}Mi"


def test_ephemeral_nvme_uses_the_tier_storage_class_and_size():
    plan, settings = make("standard", storage_class="local-nvme")
    nvme = volumes_by_name(render_pod_template(plan, settings))["nvme"]
    claim = nvme["ephemeral"]["volumeClaimTemplate"]["spec"]
    assert claim == {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "100Gi"}},
        "storageClassName": "local-nvme",
    }


def test_persistent_nvme_is_a_statefulset_claim_template():
    plan, settings = make("premium", storage_class="local-nvme")
    sts = render_workload(plan, settings)
    assert sts["kind"] == "StatefulSet"
    assert "nvme" not in volumes_by_name(sts["spec"]["template"])
    (template,) = sts["spec"]["volumeClaimTemplates"]
    assert template["metadata"]["name"] == "nvme"
    assert template["spec"]["resources"]["requests"]["storage"] == "200Gi"
    assert template["spec"]["storageClassName"] == "local-nvme"
    assert sts["spec"]["persistentVolumeClaimRetentionPolicy"]["whenDeleted"] == "Delete"
    assert sts["spec"]["serviceName"] == "chat-metrics"


@pytest.mark.parametrize("tier", TIERS)
def test_host_path_fallback_gives_each_pod_its_own_directory(tier):
    plan, settings = make(tier, "hostPath")
    workload = render_workload(plan, settings)
    assert "volumeClaimTemplates" not in workload["spec"]
    pod = workload["spec"]["template"]
    assert volumes_by_name(pod)["nvme"]["hostPath"] == {"path": "/mnt/nvme", "type": "DirectoryOrCreate"}
    sidecar = pod["spec"]["initContainers"][-1]
    mount = next(m for m in sidecar["volumeMounts"] if m["name"] == "nvme")
    assert mount["subPathExpr"] == "$(POD_NAMESPACE)/$(POD_NAME)"
    assert mount["mountPath"] == plan.worker.kvtier.nvme.path


def test_shared_tier_mounts_a_per_service_rwx_claim():
    plan, settings = make("batch", cache={"shared": True})
    pod = render_pod_template(plan, settings)
    assert volumes_by_name(pod)["shared"]["persistentVolumeClaim"] == {"claimName": "chat-kv-shared"}
    claim = render_shared_claim(plan)
    assert claim is not None and claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "1Ti"
    assert render_shared_claim(make("batch")[0]) is None


def test_no_nvme_means_no_nvme_volume_and_no_nvme_node_selector():
    plan, settings = make(cache={"nvme": "0"})
    pod = render_pod_template(plan, settings)
    assert "nvme" not in volumes_by_name(pod)
    assert "strata.dev/local-nvme" not in pod["spec"]["nodeSelector"]


def test_cpu_only_service_requests_no_gpu():
    plan, settings = make(resources={"gpus": 0})
    engine = render_pod_template(plan, settings)["spec"]["containers"][0]
    assert GPU_RESOURCE not in engine["resources"]["requests"]
    assert plan.worker.engine.device == "cpu"


def test_config_hash_rolls_pods_on_spec_changes_only():
    base, settings = make()
    same, _ = make()
    other_model, _ = make(model={"name": "tiny-2"})
    more_dram, _ = make(cache={"dram": "8Gi"})
    hashes = {config_hash(p) for p in (other_model, more_dram)}
    assert config_hash(base) == config_hash(same) and config_hash(base) not in hashes and len(hashes) == 2
    annotation = render_pod_template(base, settings)["metadata"]["annotations"][names.ANNOTATION_CONFIG_HASH]
    assert annotation == config_hash(base)


def test_configmap_holds_the_worker_config():
    plan, _ = make("premium")
    cm = render_configmap(plan)
    assert cm["metadata"]["name"] == "chat-config"
    assert WorkerConfig.from_yaml(cm["data"]["worker.yaml"]) == plan.worker


def test_every_child_is_owned_by_the_service_and_labelled():
    plan, settings = make("batch", cache={"shared": True})
    children = [
        render_configmap(plan),
        render_client_service(plan),
        render_metrics_service(plan),
        render_pdb(plan),
        render_shared_claim(plan),
        render_workload(plan, settings),
    ]
    for child in children:
        assert child is not None
        meta = child["metadata"]
        assert meta["namespace"] == "team-a"
        assert meta["ownerReferences"] == [
            {
                "apiVersion": "strata.dev/v1alpha1",
                "kind": "InferenceService",
                "name": "chat",
                "uid": "uid-chat",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        assert meta["labels"][names.LABEL_MANAGED_BY] == "strata-operator"
        assert meta["labels"][names.LABEL_SERVICE] == "chat"


def test_clients_reach_the_routers_and_the_headless_service_selects_the_workers():
    plan, _ = make()
    client, metrics = render_client_service(plan), render_metrics_service(plan)
    assert client["spec"]["selector"] == names.router_selector_labels("chat")
    assert metrics["spec"]["selector"] == names.selector_labels("chat")
    assert metrics["spec"]["clusterIP"] == "None" and metrics["spec"]["publishNotReadyAddresses"]
    assert [p["name"] for p in metrics["spec"]["ports"]] == ["http", "kv-metrics"]


@pytest.mark.parametrize(("replicas", "minimum", "expected"), [(1, 1, 1), (4, 2, 2), (3, 3, 1), (5, 0, 5)])
def test_pdb_keeps_the_minimum_but_never_blocks_drains(replicas, minimum, expected):
    assert max_unavailable(replicas, minimum) == expected


def test_pdb_selects_the_workers():
    pdb = render_pdb(make(replicas=3, minReplicas=2, maxReplicas=4)[0])
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == names.selector_labels("chat")


def test_priorityclass_is_owned_by_the_tier():
    pc = render_priorityclass(
        "premium", 1000000, OwnerRef("strata.dev/v1alpha1", "ServiceTier", "premium", "u1")
    )
    assert pc["metadata"]["name"] == "strata-premium" and pc["value"] == 1000000
    assert pc["metadata"]["ownerReferences"][0]["kind"] == "ServiceTier"
    assert "namespace" not in pc["metadata"] and pc["globalDefault"] is False


def test_extra_tolerations_come_from_the_settings():
    plan, _ = make()
    settings = OperatorSettings(tolerations=({"key": "dedicated", "operator": "Exists"},))
    tolerations = render_pod_template(plan, settings)["spec"]["tolerations"]
    assert {"key": "dedicated", "operator": "Exists"} in tolerations
    assert {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"} in tolerations


def test_image_pull_secrets_come_from_the_settings():
    plan, _ = make()
    assert "imagePullSecrets" not in render_pod_template(plan, OperatorSettings())["spec"]
    spec = render_pod_template(plan, OperatorSettings(image_pull_secrets=("regcred",)))["spec"]
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]


def test_engine_image_on_the_service_overrides_the_default():
    plan, settings = make(engine={"image": "registry.local/strata:dev"})
    assert all(
        c["image"] == "registry.local/strata:dev" for c in containers(render_pod_template(plan, settings))
    )


GATED_POD = {
    "env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}}],
    "envFrom": [{"configMapRef": {"name": "extra"}, "prefix": "X_"}],
    "imagePullSecrets": [{"name": "registry"}],
    "serviceAccountName": "inference",
    "labels": {"team": "search"},
    "annotations": {"cost-center": "4711"},
    "nodeSelector": {"pool": "inference", "nvidia.com/gpu.product": "other"},
    "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "inference", "effect": "NoSchedule"}],
}


def test_pod_overrides_are_rendered_and_the_operator_keeps_its_own():
    plan, settings = make(source={"uri": "hf://org/gated"}, pod=GATED_POD)
    pod = render_pod_template(plan, settings)
    spec, meta = pod["spec"], pod["metadata"]
    by_name = {c["name"]: c for c in containers(pod)}
    for name in ("engine", "model"):  # the fetcher needs HF_TOKEN, the engine STRATA_API_KEY and the like
        env = by_name[name]["env"]
        assert [e["name"] for e in env] == ["POD_NAME", "POD_NAMESPACE", "POD_IP", "HF_TOKEN"]
        assert env[3]["valueFrom"] == {
            "secretKeyRef": {"name": "hf-token", "key": "token", "optional": False}
        }
        assert by_name[name]["envFrom"] == [
            {"configMapRef": {"name": "extra", "optional": False}, "prefix": "X_"}
        ]
    assert "envFrom" not in by_name["kvtier"] and len(by_name["kvtier"]["env"]) == 3  # no tenant secrets
    assert spec["imagePullSecrets"] == [{"name": "registry"}]
    assert spec["serviceAccountName"] == "inference" and spec["automountServiceAccountToken"] is False
    assert spec["affinity"] == GATED_POD["affinity"]
    assert spec["tolerations"][-1]["key"] == "dedicated" and spec["tolerations"][0]["key"] == GPU_RESOURCE
    assert spec["nodeSelector"]["pool"] == "inference"
    assert spec["nodeSelector"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"  # the service's wins
    assert meta["labels"]["team"] == "search" and meta["labels"][names.LABEL_COMPONENT] == "worker"
    assert (
        meta["annotations"]["cost-center"] == "4711" and names.ANNOTATION_CONFIG_HASH in meta["annotations"]
    )


def test_no_pod_overrides_render_as_before():
    plan, settings = make()
    spec = render_pod_template(plan, settings)["spec"]
    assert not {"imagePullSecrets", "serviceAccountName", "affinity"} & spec.keys()
    assert [e["name"] for e in spec["containers"][0]["env"]] == ["POD_NAME", "POD_NAMESPACE", "POD_IP"]


@pytest.mark.parametrize(("tier", "mode", "source"), list(itertools.product(TIERS, MODES, SOURCES)))
def test_configs_render_to_the_text_of_pythons_own_yaml_emitter(tier, mode, source):
    """The ConfigMap goes through libyaml's emitter when it is there; a different text would
    change the config hash, and so roll every pod of the fleet on an operator upgrade."""
    plan, _ = make(tier, mode, source)
    for text in render_configmap(plan)["data"].values():
        assert text == yaml.safe_dump(yaml.safe_load(text), sort_keys=False)
