"""``python -m bench vllm``: vLLM behind an InferenceService, on a control plane of its own whose
local node runs the pods for real (vLLM's CPU build, ``make vllm-env``).

- ``ttft_s``: one vLLM pod of the ``hf-medium`` model (51M parameters in float32: a 4k-token
  prefill dominates a request here) with Strata's sidecar (the premium tier's write-through to
  NVMe), one prompt of ``PROMPT_TOKENS`` tokens: cold; again (vLLM's own prefix cache); after
  the engine container was SIGKILLed and restarted (HBM gone: Strata's DRAM); after the pod was
  deleted and its StatefulSet made a new one (DRAM gone: NVMe). Every row's output at
  temperature 0 is compared with the cold run's, and each row says how many prompt tokens vLLM
  did not compute (``cached_tokens``, from the stream's usage).
- ``routing``: two vLLM pods (``hf-small``, HBM only, each holding about a quarter of the
  slice's distinct prefix blocks) behind the router, its cache-aware policy against round-robin,
  on a slice of the Mooncake conversation trace, each policy with tokens of its own (no cache
  carried over): cached prompt tokens as vLLM reported them in its answers, what the router
  predicted they would be, and client TTFT p50/p90. The router is a process here with the
  router.yaml the operator rendered for the service, sent to the pods' addresses (the local node
  has no cores to spare for two router pods), once per policy.
- ``offloading_connector``: vLLM's own CPU offloading in place of Strata's connector, where it
  runs; where it does not, its error.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import yaml

from strata.cluster import Cluster, ClusterConfig, find_bin_dir, launch
from strata.common.traces import traces_dir
from strata.demo import dataplane
from strata.demo.walk import WalkPod, crash, replace
from strata.loadgen.replay import replay
from strata.loadgen.summary import Outcome, percentile
from strata.loadgen.trace import Scaling, TimedRequest, read_trace, timed_requests
from strata.operator import names
from strata.stack import local_pods_env, operator_running
from strata.stack.dataplane import RouterProcess, running_router
from strata.stack.serving import loopback_ip, ready_worker_pods
from strata.stack.vllm import (
    LOCAL_ARGS,
    VLLM_CPU_BLOCK,
    ensure_vllm_env,
    running_vllm,
    vllm_service,
    vllm_tier,
)
from strata.stack.wait import free_port, wait_for
from strata.worker.config import WorkerConfig
from strata.worker.models.presets import PRESETS, write_model

MODEL = "hf-medium"
NAMESPACE, TIER = "default", "bench-vllm"
PROMPT_TOKENS = 4608  # 144 blocks of 32
READY_S = 1800.0  # a vLLM pod's start on a loaded two-core machine
COMMITTED_S = 300.0
# The routed slice: the conversation trace's first records, one trace block (512 tokens) a vLLM
# block, prompts of at most 12 of them, all sent at once and CONCURRENCY at a time (the trace's
# order, not its pace), to a smaller model so that a slice with real reuse runs in minutes.
# The routing simulator (bench/routing_sim.py) gives the strata policy 1.40x round-robin's hit
# ratio on this slice at these capacities, 1.03x on the first 160 records.
SLICE = 1600
SHAPE = Scaling(block_tokens=VLLM_CPU_BLOCK, max_prompt_tokens=384, max_output_tokens=4, time_compression=1e6)
ROUTING_MODEL = "hf-small"
CONCURRENCY = 4
POLICIES = ("round-robin", "strata")
SYNC_S = 180.0
SYNCED = 'strata_router_event_streams{source="worker",state="synced"}'


def run() -> dict[str, Any]:
    ensure_vllm_env()
    root = Path(tempfile.mkdtemp(prefix="bench-vllm-", dir="/tmp"))
    try:
        with own_cluster(root) as cluster:
            rows = ttft_rows(cluster, root)
            cluster.kubectl(
                "delete", "inferenceservice", "ttft", "-n", NAMESPACE, "--wait=true", "--timeout=600s"
            )
            routing = routing_rows(cluster, root)
        offloading = offloading_row(root)
        return {
            **rows,
            "routing": routing,
            "offloading_connector": offloading,
            "summary": summary(rows, routing),
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


@contextmanager
def own_cluster(root: Path) -> Iterator[Cluster]:
    """A control plane whose local node offers two vLLM pods' requests; the operator on it."""
    config = ClusterConfig(gpu_nodes=1, local_nodes=1, local_node_cpu="4", start_timeout_s=600)
    cluster = launch(root / "cluster", config, bin_dir=find_bin_dir())
    try:
        with operator_running(cluster, root / "operator.log", env=local_pods_env(root / "nvme")):
            cluster.apply(vllm_tier(TIER))
            yield cluster
    finally:
        cluster.stop()


# ---------------------------------------------------------------------------------------- TTFT


def ttft_rows(cluster: Cluster, root: Path) -> dict[str, Any]:
    cache = {"hbm": "512Mi", "dram": "512Mi", "nvme": "2Gi"}
    cluster.apply(vllm_service("ttft", TIER, MODEL, cache, max_context=8192), NAMESPACE)
    pod = ready_pods(cluster, "ttft", 1)[0]
    prompt = dataplane.long_prompt(PROMPT_TOKENS)
    rows: dict[str, FirstToken] = {}
    rows["cold"] = first_token(pod.api, prompt)
    rows["hbm"] = first_token(pod.api, prompt)
    held_on_nvme(pod)
    crash(cluster, pod, ["engine"])
    rows["dram"] = first_token(pod.api, prompt)
    replace(cluster, pod)
    # The new pod's sidecar recovers its NVMe index when vLLM's connector first connects, at
    # this request: the recovery is part of the row.
    pod = ready_pods(cluster, "ttft", 1)[0]
    rows["nvme"] = first_token(pod.api, prompt)
    return ttft_result(rows, len(prompt.encode()))


def held_on_nvme(pod: WalkPod) -> None:
    wanted = PROMPT_TOKENS // VLLM_CPU_BLOCK - 1
    wait_for(
        lambda: dataplane.held_blocks(pod.kv_metrics)["nvme"] >= wanted, COMMITTED_S, what="blocks on NVMe"
    )


def ttft_result(rows: dict[str, FirstToken], prompt_tokens: int) -> dict[str, Any]:
    times = {k: row.ttft_s for k, row in rows.items()}
    return {
        "ttft_s": {k: round(v, 4) for k, v in times.items()},
        "cached_tokens": {k: row.cached_tokens for k, row in rows.items()},
        "prompt_tokens": prompt_tokens,
        "outputs_equal": len({row.text for row in rows.values()}) == 1,
        "outputs": {k: row.text for k, row in rows.items()},
        "speedup": {k: round(times["cold"] / v, 2) for k, v in times.items() if k != "cold"},
    }


@dataclasses.dataclass(frozen=True)
class FirstToken:
    ttft_s: float
    text: str
    cached_tokens: int  # the prompt tokens vLLM did not compute: its prefix cache or Strata's tiers


def first_token(api: str, prompt: str) -> FirstToken:
    """Client-side TTFT of a streamed completion at temperature 0, its whole text, and the cached
    prompt tokens vLLM reports in the stream's usage."""
    body = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": 8,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start, ttft, text = time.perf_counter(), None, []
    usage: dict[str, Any] = {}
    with httpx.stream("POST", f"{api}/v1/completions", json=body, timeout=1200) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line.removeprefix("data: "))
                usage = chunk.get("usage") or usage
                for choice in chunk.get("choices") or []:
                    ttft = ttft if ttft is not None else time.perf_counter() - start
                    text.append(choice.get("text") or "")
    if ttft is None:
        raise RuntimeError(f"{api}: the stream ended before the first token")
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return FirstToken(ttft, "".join(text), int(cached))


def ready_pods(cluster: Cluster, service: str, count: int) -> list[WalkPod]:
    """The service's ``count`` Ready worker pods, with the worker.yaml its ConfigMap holds."""

    pods = ready_worker_pods(cluster, NAMESPACE, service, count, READY_S)
    data = cluster.kubectl_json("get", "configmap", names.configmap_name(service), "-n", NAMESPACE)["data"]
    config = WorkerConfig.from_yaml(data["worker.yaml"])
    return [WalkPod(NAMESPACE, p["metadata"]["name"], loopback_ip(p), config) for p in pods]


# -------------------------------------------------------------------- vLLM's own CPU offloading


def offloading_row(root: Path) -> dict[str, Any]:
    """vLLM's own OffloadingConnector in place of Strata's, as a process here: TTFT from its CPU
    copy after vLLM's prefix cache was reset, where it runs; where it does not, its error."""
    (root / "off-run").mkdir()
    config = WorkerConfig.model_validate({
        "model": {"name": MODEL, "path": str(write_model(root / "off-model", MODEL)), "dtype": "float32",
                  "max_context_tokens": 8192},
        "engine": {"kind": "vllm", "device": "cpu", "block_size": VLLM_CPU_BLOCK, "kv_cache_bytes": 1 << 29},
        "kvtier": {"socket_path": str(root / "off-run" / "kvtier.sock")},
    })  # fmt: skip
    (root / "off.yaml").write_text(config.to_yaml())
    offload = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
               "kv_connector_extra_config": {"cpu_bytes_to_use": 1 << 30}}  # fmt: skip
    args = [*LOCAL_ARGS, f"--kv-transfer-config={json.dumps(offload)}"]
    prompt, log = dataplane.long_prompt(PROMPT_TOKENS), root / "offloading.log"
    try:
        with running_vllm(ensure_vllm_env(), config, root / "off.yaml", free_port(), log, *args) as engine:
            cold = first_token(engine.url, prompt)
            httpx.post(f"{engine.url}/reset_prefix_cache", timeout=60).raise_for_status()
            offloaded = first_token(engine.url, prompt)
    except (AssertionError, httpx.HTTPError, RuntimeError) as err:
        return {"ran": False, "error": last_error(log.read_text() if log.exists() else str(err))}
    return {"ran": True, "ttft_s": {"cold": round(cold.ttft_s, 4), "cpu": round(offloaded.ttft_s, 4)},
            "outputs_equal": cold.text == offloaded.text}  # fmt: skip


def last_error(log: str) -> str:
    """The line that says why vLLM stopped: its root cause where vLLM names one (a worker's
    error), else the first exception's, else the last line."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    roots = [line for line in lines if "Worker failed with error" in line]
    errors = [line for line in lines if "Error:" in line]
    return (roots or errors[:1] or lines[-1:] or ["no output"])[0][-500:]


# ------------------------------------------------------------------------------------- routing


def routing_rows(cluster: Cluster, root: Path) -> dict[str, Any]:
    records = read_trace(traces_dir() / "mooncake_conversation.jsonl", count=SLICE)
    distinct = distinct_blocks(timed_requests(records, SHAPE))
    hbm = distinct // 4 * VLLM_CPU_BLOCK * kv_bytes_per_token(ROUTING_MODEL)
    # vLLM's cache must hold one whole context: the routed prompts' longest
    spec = vllm_service(
        "route", TIER, ROUTING_MODEL, {"hbm": str(hbm), "dram": "0", "nvme": "0"}, max_context=1024
    )
    spec["spec"].update(replicas=2, minReplicas=2, maxReplicas=2)
    cluster.apply(spec, NAMESPACE)
    pods = ready_pods(cluster, "route", 2)
    config = router_yaml(cluster, pods, write_model(root / "model", ROUTING_MODEL))
    out: dict[str, Any] = {"distinct_prefix_blocks": distinct, "hbm_blocks_per_pod": distinct // 4}
    for seed, policy in enumerate(POLICIES, 1):
        requests = timed_requests(records, dataclasses.replace(SHAPE, seed=seed))
        out[policy.replace("-", "_")] = phase(root, {**config, "policy": policy}, requests)
    strata, rr = out["strata"], out["round_robin"]
    out["cached_ratio"] = round(strata["cached_tokens"] / max(1, rr["cached_tokens"]), 3)
    out["predicted_cached_tokens"] = strata["predicted_cached_tokens"]
    out["prediction_error"] = round(
        abs(strata["predicted_cached_tokens"] / max(1, strata["cached_tokens"]) - 1), 4
    )
    return out


def kv_bytes_per_token(preset: str) -> int:
    """A float32 test model's KV bytes a token: 2 x layers x KV heads x head dim x 4."""
    config = PRESETS[preset]
    return 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * 4


def distinct_blocks(requests: list[TimedRequest]) -> int:
    """Distinct block prefixes in the slice: what unbounded prefix caches would hold in all."""
    return len({r.blocks[:i] for r in requests for i in range(1, len(r.prompt) // VLLM_CPU_BLOCK + 1)})


def router_yaml(cluster: Cluster, pods: list[WalkPod], model: Path) -> dict[str, Any]:
    data = cluster.kubectl_json("get", "configmap", names.configmap_name("route"), "-n", NAMESPACE)["data"]
    config: dict[str, Any] = yaml.safe_load(data["router.yaml"])
    config["host"] = "127.0.0.1"
    config["workers"] = {**config["workers"], "static": [p.api for p in pods], "label_selector": ""}
    config["model"]["path"] = str(model)
    return config


def phase(root: Path, config: dict[str, Any], requests: list[TimedRequest]) -> dict[str, Any]:
    with running_router(root, config) as router:
        wait_for(
            lambda: router.metrics().get(SYNCED, 0) >= 2, SYNC_S, what="the router to follow both relays"
        )
        outcomes = asyncio.run(_replay(router, requests))
        predicted = router.metrics().get("strata_router_predicted_cached_tokens_total", 0.0)
    ttfts = [o.ttft_s for o in outcomes if o.error is None and o.ttft_s is not None]
    p50, p90 = percentile(ttfts, 0.5), percentile(ttfts, 0.9)
    return {
        "requests": len(outcomes),
        "errors": sum(o.error is not None for o in outcomes),
        "prompt_tokens": sum(o.prompt_tokens for o in outcomes),
        "cached_tokens": sum(o.cached_tokens for o in outcomes if o.error is None),
        "predicted_cached_tokens": int(predicted),
        "ttft_p50_s": None if p50 is None else round(p50, 4),
        "ttft_p90_s": None if p90 is None else round(p90, 4),
    }


async def _replay(router: RouterProcess, requests: list[TimedRequest]) -> list[Outcome]:
    client = openai.AsyncOpenAI(
        base_url=router.base_url + "/v1", api_key="unused", max_retries=0, timeout=1200
    )
    try:
        return await replay(client, ROUTING_MODEL, requests, max_in_flight=CONCURRENCY)
    finally:
        await client.close()


def summary(rows: dict[str, Any], routing: dict[str, Any]) -> str:
    speed = rows["speedup"]
    return (
        f"TTFT at {rows['prompt_tokens']} tokens: cold {rows['ttft_s']['cold']:.2f} s; hbm {speed['hbm']}x, "
        f"dram {speed['dram']}x, nvme {speed['nvme']}x faster; outputs equal {rows['outputs_equal']}; "
        f"routing: cached tokens {routing['cached_ratio']}x round-robin's, prediction off by "
        f"{routing['prediction_error']:.1%}"
    )
