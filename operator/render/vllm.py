"""The engine container of ``engine.kind: vllm``: vLLM's OpenAI server, wired to the platform.

Every flag rendered here comes from the spec or ties vLLM to the pod: the model the init
container fetched and its served name, the pod IP and port, the context length, dtype, block
size (the KV-tier sidecar's too), the batch limits, tensor parallelism over the replica's GPUs,
the KV cache's size where ``spec.cache.hbm`` caps it, prefix caching, cached-token counts in
every answer (the router's accounting), the KV events the sidecar relays to the routers (a vLLM
pod always has the sidecar, for that), and, where the tier gives lower cache tiers, Strata's
connector. Each is one the tenant
may not pass (``api.engine.VLLM_OWNED_FLAGS``); ``spec.engine.vllm.args`` follow them.
"""

from __future__ import annotations

import json

from strata.operator import names
from strata.operator.plan import ServicePlan
from strata.operator.render.common import Manifest
from strata.worker.config import API_KEY_ENV, KVTierConfig, WorkerConfig, engine_event_endpoints

CONNECTOR = "StrataConnector"
CONNECTOR_MODULE = "strata.worker.vllm.connector"
EVENTS_TOPIC = "kv"
# vLLM and the caches it fills (Hugging Face, torch.compile) write under HOME; the root file
# system is read-only, so they write in the pod's /tmp.
WRITABLE_HOME = "/tmp"
VLLM_API_KEY = "VLLM_API_KEY"


def vllm_args(plan: ServicePlan) -> list[str]:
    return [*serve_args(plan.worker, plan.gpus, "$(POD_IP)"), *plan.engine_args]


def serve_args(worker: WorkerConfig, gpus: int, host: str, config_path: str = names.CONFIG_PATH) -> list[str]:
    """The flags of ``vllm serve`` for ``worker`` (the sidecar's config, at ``config_path`` for
    the connector) on ``gpus`` GPUs, listening on ``host``."""
    engine, model = worker.engine, worker.model
    args = [
        f"--served-model-name={model.name}",
        f"--host={host}",
        f"--port={worker.server.port}",
        f"--max-model-len={model.max_context_tokens}",
        f"--dtype={model.dtype}",
        f"--block-size={engine.block_size}",
        "--enable-prefix-caching",
        "--enable-prompt-tokens-details",
        f"--max-num-seqs={engine.max_num_seqs}",
        f"--max-num-batched-tokens={engine.max_batched_tokens}",
        f"--tensor-parallel-size={max(1, gpus)}",
    ]
    if engine.kv_cache_bytes is not None:
        args.append(f"--kv-cache-memory-bytes={engine.kv_cache_bytes}")
    args += [f"--kv-events-config={json.dumps(events_config(worker.kvtier))}"]  # the sidecar relays them
    if worker.kvtier.enabled:  # tiers to connect to
        args += [f"--kv-transfer-config={json.dumps(transfer_config(config_path))}"]
    return args


def events_config(kvtier: KVTierConfig) -> dict[str, object]:
    """vLLM binds its KV-event sockets in the pod's socket directory; the sidecar relays them."""
    events, replay = engine_event_endpoints(kvtier)
    return {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": events,
        "replay_endpoint": replay,
        "topic": EVENTS_TOPIC,
    }


def transfer_config(config_path: str = names.CONFIG_PATH) -> dict[str, object]:
    """Strata's connector, reading the worker config the sidecar reads; a block that fails to
    load (a checksum, a sidecar gone) is recomputed, never served."""
    return {
        "kv_connector": CONNECTOR,
        "kv_connector_module_path": CONNECTOR_MODULE,
        "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"config": config_path},
    }


def vllm_env() -> list[Manifest]:
    """After the pod's own variables (POD_IP first), before the tenant's (which may override)."""
    return [
        # vLLM's processes find each other at this address; unset, vLLM probes a public one.
        {"name": "VLLM_HOST_IP", "value": "$(POD_IP)"},
        {"name": "HOME", "value": WRITABLE_HOME},
        {"name": "VLLM_NO_USAGE_STATS", "value": "1"},
    ]


def vllm_api_key_env(plan: ServicePlan) -> list[Manifest]:
    """vLLM's own key check (on ``/v1``) with the key the service gives in ``spec.pod.env`` as
    ``STRATA_API_KEY``: the engine requires what the routers require. After the tenant's
    variables, which define the one it names; none where the tenant sets ``VLLM_API_KEY``."""
    given = {e.get("name") for e in plan.pod.env}
    if API_KEY_ENV not in given or VLLM_API_KEY in given:
        return []
    return [{"name": VLLM_API_KEY, "value": f"$({API_KEY_ENV})"}]


def vllm_command(plan: ServicePlan) -> list[str]:
    return ["vllm", "serve", plan.worker.model.path]
