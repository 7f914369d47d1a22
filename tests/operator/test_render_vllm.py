"""Rendering ``engine.kind: vllm``: vLLM's server from the spec, wired to the sidecar and routers."""

from __future__ import annotations

import json

from strata.common.kvbudget import KVTIER_STAGING_BYTES
from strata.operator.api.engine import owned_flag_reason, vllm_flag
from strata.operator.render.common import bytes_quantity
from strata.operator.render.pod import render_pod_template
from strata.operator.render.volumes import SHM_HEADROOM_BYTES, TP_SHM_BYTES_PER_GPU
from strata.operator.resolve import ResolveInput, resolve
from strata.operator.settings import OperatorSettings
from strata.worker.config import engine_event_endpoints

from .factories import NS_UID, isvc_body, tier_body

SETTINGS = OperatorSettings(vllm_image="example.com/strata-vllm:1")


def make(tier="standard", args=(), gpus=1, **spec):
    body = isvc_body(tier=tier, **spec)
    body["spec"]["engine"] = {"kind": "vllm", "blockSize": 32, "vllm": {"args": list(args)}}
    body["spec"]["resources"]["gpus"] = gpus
    return resolve(ResolveInput(body, tier_body(tier), NS_UID))


def engine(plan):
    return render_pod_template(plan, SETTINGS)["spec"]["containers"][0]


def flags(container):
    return {vllm_flag(a): a.split("=", 1)[1] if "=" in a else True for a in container["args"] if vllm_flag(a)}


def test_vllm_serves_the_fetched_model_with_the_specs_settings():
    plan = make(gpus=4)
    container = engine(plan)
    assert container["image"] == "example.com/strata-vllm:1"
    assert container["command"] == ["vllm", "serve", "/models/model"]
    got = flags(container)
    assert got["served-model-name"] == plan.worker.model.name and got["host"] == "$(POD_IP)"
    assert got["port"] == "8000" and got["block-size"] == "32" and got["tensor-parallel-size"] == "4"
    assert got["max-model-len"] == str(plan.worker.model.max_context_tokens) and got["enable-prefix-caching"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["VLLM_HOST_IP"] == "$(POD_IP)"  # never a probe of a public address for its own


def test_every_flag_the_operator_renders_is_one_the_tenant_may_not_pass():
    for arg in engine(make())["args"]:
        flag = vllm_flag(arg)
        assert flag is not None and owned_flag_reason(flag) is not None, arg


def test_the_tenants_arguments_come_last_and_unchanged():
    args = ("--enable-lora", "--max-loras", "4")
    assert engine(make(args=args))["args"][-3:] == list(args)


def test_the_sidecar_hears_vllms_kv_events_and_vllm_loads_strata_connector():
    plan = make()
    got = flags(engine(plan))
    events = json.loads(got["kv-events-config"])
    assert (events["endpoint"], events["replay_endpoint"]) == engine_event_endpoints(plan.worker.kvtier)
    assert events["endpoint"].startswith("ipc:///run/strata/")  # the socket volume both containers mount
    transfer = json.loads(got["kv-transfer-config"])
    assert transfer["kv_connector_module_path"] == "strata.worker.vllm.connector"
    assert transfer["kv_load_failure_policy"] == "recompute"
    pod = render_pod_template(plan, SETTINGS)
    sidecar = next(c for c in pod["spec"]["initContainers"] if c["name"] == "kvtier")
    assert sidecar["image"] == SETTINGS.worker_image  # Strata's own image, not vLLM's
    assert plan.worker.engine.kind == "vllm" and plan.worker.engine.device == "cuda"


def test_without_lower_tiers_the_sidecar_still_relays_events_and_no_connector_is_loaded():
    plan = make(cache={"dram": "0", "nvme": "0"})
    assert plan.kv_sidecar and not plan.worker.kvtier.enabled
    got = flags(engine(plan))
    assert "kv-events-config" in got and "kv-transfer-config" not in got
    assert plan.router.workers.kv_events_port == plan.kv_metrics_port


def test_the_kv_cache_size_follows_spec_cache_hbm():
    assert "kv-cache-memory-bytes" not in flags(engine(make()))
    assert flags(engine(make(cache={"hbm": "2Gi"})))["kv-cache-memory-bytes"] == str(2 << 30)


def test_tensor_parallel_replicas_get_shared_memory_for_their_workers():
    one, four = make(gpus=1), make(gpus=4)
    limits = [
        next(v for v in render_pod_template(p, SETTINGS)["spec"]["volumes"] if v["name"] == "shm")["emptyDir"]
        for p in (one, four)
    ]
    size = one.dram_bytes + KVTIER_STAGING_BYTES + SHM_HEADROOM_BYTES
    assert [limit["sizeLimit"] for limit in limits] == [
        bytes_quantity(size),
        bytes_quantity(size + 4 * TP_SHM_BYTES_PER_GPU),
    ]


def test_the_routers_follow_the_relay_and_tokenize_with_the_models_files():
    router = make().router
    assert router.workers.engine == "vllm" and router.workers.device == "cuda"
    assert router.model.path == "/models/model"  # vLLM's tokenizer, even for a builtin model


def test_vllm_requires_the_key_the_routers_require() -> None:
    key = {"name": "STRATA_API_KEY", "valueFrom": {"secretKeyRef": {"name": "api", "key": "key"}}}
    names = [e["name"] for e in engine(make(pod={"env": [key]}))["env"]]
    assert names.index("VLLM_API_KEY") > names.index("STRATA_API_KEY")  # defined before it is used
    env = {e["name"]: e.get("value") for e in engine(make(pod={"env": [key]}))["env"]}
    assert env["VLLM_API_KEY"] == "$(STRATA_API_KEY)"
    assert "VLLM_API_KEY" not in {e["name"] for e in engine(make())["env"]}  # no key: none
    own = {"name": "VLLM_API_KEY", "value": "theirs"}
    assert [e for e in engine(make(pod={"env": [key, own]}))["env"] if e["name"] == "VLLM_API_KEY"] == [own]
