"""resolve: InferenceService + ServiceTier -> ServicePlan, and every way it refuses."""

from __future__ import annotations

import pytest

from strata.operator.resolve import (
    REASON_INVALID_SPEC,
    REASON_TIER_LIMITS,
    REASON_TIER_NOT_FOUND,
    ResolveInput,
    SpecRejected,
    resolve,
)
from strata.operator.tenancy import cache_namespace
from strata.worker.config import WorkerConfig

from .factories import NS_UID, isvc_body, tier_body

GiB = 2**30


def plan_for(tier: str = "standard", ns_uid: str = NS_UID, **spec):
    return resolve(ResolveInput(isvc_body(tier=tier, **spec), tier_body(tier), ns_uid))


def test_standard_defaults_come_from_the_tier():
    plan = plan_for()
    assert plan.dram_bytes == 16 * GiB
    assert plan.nvme is not None and plan.nvme.size_bytes == 100 * GiB and not plan.nvme.persistent
    assert plan.shared is None
    assert plan.workload_kind == "Deployment"
    assert plan.priority_class == "strata-standard"
    kv = plan.worker.kvtier
    assert kv.enabled and kv.dram.capacity_bytes == 16 * GiB and kv.nvme.capacity_bytes == 100 * GiB
    assert kv.write_mode == "write-back" and kv.retention_s == 86400.0 and kv.priority == 100000


def test_tenant_request_overrides_the_default():
    plan = plan_for(cache={"dram": "4Gi", "nvme": "10Gi"})
    assert plan.dram_bytes == 4 * GiB and plan.nvme is not None and plan.nvme.size_bytes == 10 * GiB


def test_premium_keeps_nvme_across_restarts_in_a_statefulset_and_uses_shared():
    plan = plan_for("premium", cache={"shared": True})
    assert plan.workload_kind == "StatefulSet"
    assert plan.worker.kvtier.nvme.persistent
    assert plan.shared is not None and plan.shared.size_bytes == 500 * GiB
    assert plan.worker.kvtier.shared.enabled and plan.worker.kvtier.write_mode == "write-through"


def test_admission_policies_come_from_the_tier():
    assert plan_for().worker.kvtier.dram.admission == "adaptive"  # the default tiers' choice
    cache = {"dram": {"admission": "doorkeeper"}, "nvme": {"admission": "always"}}
    custom = resolve(ResolveInput(isvc_body(), tier_body("standard", cache=cache), NS_UID))
    assert custom.worker.kvtier.dram.admission == "doorkeeper"
    assert custom.worker.kvtier.nvme.admission == "always"


def test_rendered_config_round_trips_through_the_worker_schema():
    plan = plan_for("batch")
    assert WorkerConfig.from_yaml(plan.worker.to_yaml()) == plan.worker
    assert plan.worker.model.name == "tiny" and plan.worker.engine.device == "cuda"
    assert plan.worker.engine.kv_memory_fraction == 0.95


def test_pinned_prefixes_and_cpu_threads_reach_the_worker_config():
    plan = plan_for(cache={"pinnedPrefixes": ["You are a helpful assistant."]}, resources={"cpu": "2500m"})
    assert plan.worker.kvtier.pinned_prefixes == ["You are a helpful assistant."]
    assert plan.worker.engine.cpu_threads == 2  # whole CPUs granted, never oversubscribed


def test_sub_cpu_request_still_gets_one_thread():
    assert plan_for(resources={"cpu": "500m"}).worker.engine.cpu_threads == 1


def test_an_hbm_budget_caps_the_engines_kv_cache():
    assert plan_for().worker.engine.kv_cache_bytes is None
    assert plan_for(cache={"hbm": "512Ki"}).worker.engine.kv_cache_bytes == 512 * 1024


def test_zero_sizes_disable_the_sidecar():
    body = isvc_body(cache={"dram": "0", "nvme": "0"})
    plan = resolve(ResolveInput(body, tier_body(), NS_UID))
    assert not plan.kv_sidecar and plan.nvme is None and plan.dram_bytes == 0


def test_replicas_are_clamped_to_min_and_max():
    plan = plan_for(replicas=9, minReplicas=1, maxReplicas=3)
    assert plan.replicas == 3
    assert plan_for(replicas=0, minReplicas=2, maxReplicas=3).replicas == 2


def test_cache_namespace_is_per_namespace_incarnation():
    a = plan_for().worker.cache_namespace
    assert a == cache_namespace("team-a", NS_UID) == f"team-a.{NS_UID}"
    other_tenant = resolve(ResolveInput(isvc_body(namespace="team-b"), tier_body(), NS_UID))
    recreated = plan_for(ns_uid="99999999-aaaa-bbbb-cccc-dddddddddddd")
    assert len({a, other_tenant.worker.cache_namespace, recreated.worker.cache_namespace}) == 3
    # Two services of one tenant share it, so they can share cached prefixes.
    assert resolve(ResolveInput(isvc_body(name="other"), tier_body(), NS_UID)).worker.cache_namespace == a


def test_cache_namespace_refuses_malformed_input():
    with pytest.raises(ValueError, match="namespace"):
        cache_namespace("Team.A", NS_UID)
    with pytest.raises(ValueError, match="uid"):
        cache_namespace("team-a", "")


def test_missing_tier_is_rejected_naming_the_field():
    with pytest.raises(SpecRejected) as err:
        resolve(ResolveInput(isvc_body(tier="gold"), None, NS_UID))
    assert err.value.reason == REASON_TIER_NOT_FOUND and "spec.tier" in err.value.message


def test_over_limit_cache_request_is_rejected():
    with pytest.raises(SpecRejected) as err:
        resolve(ResolveInput(isvc_body(cache={"dram": "512Gi"}), tier_body(), NS_UID))
    assert err.value.reason == REASON_TIER_LIMITS and "spec.cache.dram" in err.value.message


def test_shared_tier_where_the_tier_has_none_is_rejected():
    with pytest.raises(SpecRejected, match=r"spec\.cache\.shared"):
        resolve(ResolveInput(isvc_body(cache={"shared": True}), tier_body(), NS_UID))


def test_malformed_spec_is_rejected_not_raised():
    body = isvc_body()
    body["spec"]["resources"]["gpus"] = "many"
    with pytest.raises(SpecRejected) as err:
        resolve(ResolveInput(body, tier_body(), NS_UID))
    assert err.value.reason == REASON_INVALID_SPEC and "gpus" in err.value.message


def test_pvc_model_is_mounted_at_the_model_dir():
    plan = plan_for(model={"name": "llama", "source": {"pvc": {"claimName": "weights", "path": "llama-8b"}}})
    assert plan.model_source.kind == "pvc" and plan.model_source.sub_path == "llama-8b"
    assert plan.worker.model.path == "/models"
