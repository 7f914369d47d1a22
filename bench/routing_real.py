"""The real-process half of the routing benchmark: three real workers (the ``small`` test model,
one torch thread each) behind the real router, with a recorded multi-turn chat workload replayed
at them by the official ``openai`` client (``strata.loadgen.replay``: streamed, open loop, client
side TTFT). The same workload runs through a round-robin router and through the strata router,
each on freshly started workers (no cache carried over), in one run. Cached prompt tokens come
from the workers' own metrics (``strata_worker_prefix_hit_tokens_total``, all tiers).

The workload: ``CONVERSATIONS`` chats of ``TURNS`` turns sharing one short system prompt; each turn
sends the whole history (system prompt, every earlier user message and recorded reply) plus a new
user message, about ``TURN_GAP_S`` after the previous turn (seeded jitter, so round-robin's
rotation is not in step with the chats). Each worker's HBM holds ``KV_BLOCKS`` blocks:
room for its share of the conversations when each stays on one replica, not for all of them.
"""

from __future__ import annotations

import asyncio
import random
import shutil
import tempfile
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import openai

from strata.loadgen.replay import replay
from strata.loadgen.summary import Outcome, percentile
from strata.loadgen.trace import TimedRequest, block_tokens
from strata.stack.dataplane import (
    RouterProcess,
    WorkerProcess,
    router_config,
    running_router,
    running_workers,
)

MODEL = "small"
WORKERS = 3
KV_BLOCKS = 256  # 4,096 tokens per worker: its share of the conversations, not all of them
MAX_CONTEXT = 2048
CONVERSATIONS = 10  # not a multiple of WORKERS: round-robin must not keep chats together by chance
TURNS = 5
SYSTEM_TOKENS, USER_TOKENS, REPLY_TOKENS, MAX_TOKENS = 32, 48, 48, 16
TURN_GAP_S, STAGGER_S, JITTER_S = 8.0, 0.7, 1.0
POLICIES = ("round-robin", "strata")
SYNC_WITHIN_S = 60


def workload(seed: int) -> list[TimedRequest]:
    """Every turn of every conversation, in arrival order. Different seeds give different tokens
    with the same structure."""
    system = block_tokens(0, SYSTEM_TOKENS, seed)
    jitter = random.Random(seed)
    requests: list[TimedRequest] = []
    for c in range(CONVERSATIONS):
        history = list(system)
        for t in range(TURNS):
            history += block_tokens(1 + 2 * (c * TURNS + t), USER_TOKENS, seed)
            at = c * STAGGER_S + t * TURN_GAP_S + jitter.uniform(0, JITTER_S)
            requests.append(TimedRequest(at, tuple(history), MAX_TOKENS, ()))
            history += block_tokens(2 + 2 * (c * TURNS + t), REPLY_TOKENS, seed)
    return sorted(requests, key=lambda r: r.at_s)


def hit_tokens(worker: WorkerProcess) -> float:
    with urllib.request.urlopen(worker.base_url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    lines = [line for line in text.splitlines() if line.startswith("strata_worker_prefix_hit_tokens_total")]
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines)


def wait_synced(router: RouterProcess) -> None:
    """Until the router follows every worker's block events (bounded)."""
    deadline = time.monotonic() + SYNC_WITHIN_S
    key = 'strata_router_event_streams{source="worker",state="synced"}'
    while router.metrics().get(key, 0) < WORKERS:
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"routing bench: the router did not sync {WORKERS} streams in {SYNC_WITHIN_S} s"
            )
        time.sleep(0.2)


def phase(policy: str, model_dir: Path, root: Path, requests: list[TimedRequest]) -> dict[str, Any]:
    """One policy on fresh workers: what the workers cached and what the clients saw."""
    workdirs = [root / f"{policy}-worker{i}" for i in range(WORKERS)]
    for workdir in workdirs:
        workdir.mkdir()
    with ExitStack() as stack:
        workers = stack.enter_context(
            running_workers(
                workdirs, model_dir, MODEL, max_context_tokens=MAX_CONTEXT, num_gpu_blocks=KV_BLOCKS
            )
        )
        config = router_config(
            [w.base_url for w in workers], MODEL, model={"max_context_tokens": MAX_CONTEXT}, policy=policy
        )
        router = stack.enter_context(running_router(root, config))
        wait_synced(router)
        before = sum(hit_tokens(w) for w in workers)
        outcomes = asyncio.run(_replay(router.base_url, requests))
        cached = sum(hit_tokens(w) for w in workers) - before
    return summary(outcomes, cached)


async def _replay(base_url: str, requests: list[TimedRequest]) -> list[Outcome]:
    client = openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=600)
    try:
        return await replay(client, MODEL, requests)
    finally:
        await client.close()


def summary(outcomes: list[Outcome], cached: float) -> dict[str, Any]:
    ttfts = [o.ttft_s for o in outcomes if o.error is None and o.ttft_s is not None]
    p50, p90 = percentile(ttfts, 0.5), percentile(ttfts, 0.9)
    return {
        "cached_tokens": int(cached),
        "ttft_p50_s": round(p50, 4) if p50 is not None else None,
        "ttft_p90_s": round(p90, 4) if p90 is not None else None,
        "requests": len(outcomes),
        "errors": sum(o.error is not None for o in outcomes),
        "prompt_tokens": sum(o.prompt_tokens for o in outcomes),
        "client_cached_tokens": sum(o.cached_tokens for o in outcomes if o.error is None),
        "error_kinds": sorted({o.error.split(":")[0] for o in outcomes if o.error is not None}),
    }


def run() -> dict[str, dict[str, Any]]:
    from strata.worker.models.presets import write_model  # torch: only this half needs it

    root = Path(tempfile.mkdtemp(prefix="routing-real-", dir="/tmp"))
    try:
        model_dir = write_model(root / "model", MODEL)
        return {
            policy: phase(policy, model_dir, root, workload(seed)) for seed, policy in enumerate(POLICIES, 1)
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)
