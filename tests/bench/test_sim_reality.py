"""The reality check's parts: the engine's share of a core, read from /proc, the calibrated
profile stretched by the slowdown between calibration and replay, the pod it runs on by default
(rendered with the lone worker's settings), and the path to that pod on the local runtime."""

from __future__ import annotations

import ipaddress
import os
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from bench import reality_pods
from bench.reality_worker import ENGINE_BLOCK, MAX_BATCHED_TOKENS, NUM_GPU_BLOCKS
from bench.sim_reality import Meter, first_token, metered, profile_from, run_with, scrape, thread_cpu_s
from strata.cluster import Cluster
from strata.operator.resolve import ResolveInput, resolve
from strata.sim.calibrate import StepCosts
from strata.sim.profiles import CPU, SMALL_KV_BYTES_PER_TOKEN
from strata.sim.scenario import load_tiers
from strata.stack import get
from strata.worker.models.presets import PRESETS

COSTS = StepCosts(
    overhead_s=0.005,
    decode_seq_s=0.001,
    decode_context_token_s=1e-6,
    prefill_token_s=2e-4,
    attention_pair_s=1e-8,
)


def test_thread_cpu_is_counted_per_thread():
    spun, release = threading.Event(), threading.Event()
    ident: list[int] = []

    def spin() -> None:
        ident.append(threading.get_native_id())
        until = time.thread_time() + 0.3  # CPU time, however busy the machine is
        while time.thread_time() < until:
            pass
        spun.set()
        release.wait(timeout=600)  # alive until it has been read

    before = thread_cpu_s(os.getpid())
    thread = threading.Thread(target=spin)
    thread.start()
    assert spun.wait(timeout=600), "the spinning thread never finished"
    after = thread_cpu_s(os.getpid())
    release.set()
    thread.join()
    mine = str(ident[0])
    assert mine not in before and after[mine] >= 0.25  # clock ticks: 0.3 s within a tick or two


def test_the_share_of_a_core_and_the_slowdown_stretch_every_step_cost():
    assert Meter(busy_s=10.0, cpu_s=5.0).share == 0.5
    assert Meter(busy_s=0.0, cpu_s=0.0).share == 1.0  # nothing to measure: no correction
    plain, slow = profile_from(COSTS), profile_from(COSTS, 2.0)
    for name in (
        "overhead_s",
        "prefill_token_s",
        "attention_pair_s",
        "decode_seq_s",
        "decode_context_token_s",
    ):
        assert getattr(slow, name) == pytest.approx(2 * getattr(plain, name)), name
    assert slow.lone_prefill_s(512) == pytest.approx(2 * plain.lone_prefill_s(512))


def test_the_pod_is_given_the_lone_workers_engine_settings():
    """What the operator renders from the check's InferenceService is what the lone worker
    process is given by hand, and what the simulation assumes (a float32 ``small`` model's KV
    bytes per token): the comparison means the same thing either way."""
    body = reality_pods.manifest()
    body["metadata"].update(namespace=reality_pods.NAMESPACE, uid="uid-reality", generation=1)
    tier = load_tiers()["standard"].model_dump(by_alias=True, exclude_none=True)
    tier["metadata"] = {"name": "standard", "uid": "uid-standard", "generation": 1}
    plan = resolve(ResolveInput(body, tier, "8f0c2d6e-1b7a-4e39-9d55-3c1f2a7b6e40"))
    engine, small = plan.worker.engine, PRESETS["small"]
    head_dim = small.hidden_size // small.num_attention_heads
    per_token = small.num_hidden_layers * 2 * small.num_key_value_heads * head_dim * 4  # K and V, float32
    assert per_token == SMALL_KV_BYTES_PER_TOKEN
    assert plan.worker.model.dtype == "float32"
    assert plan.replicas == 1 and not plan.kv_sidecar
    assert (engine.block_size, engine.max_batched_tokens, engine.cpu_threads) == (
        ENGINE_BLOCK,
        MAX_BATCHED_TOKENS,
        1,
    )
    assert engine.kv_cache_bytes == NUM_GPU_BLOCKS * ENGINE_BLOCK * per_token
    assert engine.queue_timeout_s == CPU.queue_timeout_s


@pytest.mark.cluster
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_check_reaches_a_pod_of_the_local_runtime(cluster: Cluster, tmp_path: Path) -> None:
    """The pod path end to end, short of the replay: the service is Ready on the local node,
    its engine answers on the pod IP, the metered process is the engine container's (its busiest
    thread's CPU time grows over a prompt), and the service is gone afterwards."""
    with reality_pods.pod_worker(cluster, tmp_path) as worker:
        assert ipaddress.ip_address(urlsplit(worker.base).hostname or "").is_loopback
        with metered(worker) as meters:
            ttft, _ = run_with(worker, lambda c: first_token(c, list(range(32, 32 + 256)), 1))
        assert ttft > 0 and meters[0].cpu_s > 0 and meters[0].busy_s > 0, meters
        assert scrape(worker.base).prompt_tokens >= 256
    assert get(cluster, "inferenceservice", reality_pods.NAME, reality_pods.NAMESPACE) is None
