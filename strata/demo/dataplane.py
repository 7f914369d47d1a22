"""The data-plane half of the demo: what a client measures at the walk-through's real pod.

The pod (its torch worker and its KV-tier sidecar) is run by the cluster's pod runtime; this
module only talks to it over HTTP at the pod's IP: one long prompt's time to first token, the
worker's prompt tokens served per cache tier, and the blocks the sidecar holds per tier.
"""

from __future__ import annotations

import json
import time

import httpx

from strata.common.tiers import TIERS
from strata.operator.autoscale.metrics import VLLM_CACHED, VLLM_SOURCES


def long_prompt(tokens: int) -> str:
    """A deterministic document; the test models' byte-level tokenizer makes one char one token."""
    words = ["tier", "block", "prefix", "cache", "token", "memory", "latency", "batch", "node", "hit"]
    text: list[str] = []
    length = 0
    while length < tokens:
        word = f"{words[len(text) % len(words)]}{len(text) % 97}"
        text.append(word)
        length += len(word) + 1
    return " ".join(text)[:tokens]


def time_to_first_token(api: str, model: str, prompt: str) -> float:
    """Client-side TTFT: from sending the request to the first streamed token."""
    body = {"model": model, "prompt": prompt, "max_tokens": 4, "temperature": 0, "stream": True}
    start = time.perf_counter()
    with httpx.stream("POST", f"{api}/v1/completions", json=body, timeout=600) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line.removeprefix("data: "))
                if chunk["choices"][0].get("text") is not None:
                    return time.perf_counter() - start
    raise RuntimeError("the stream ended before the first token")


def per_tier(metrics: str, name: str) -> dict[str, float]:
    """The samples of metric family ``name`` by their ``tier`` label (0 for a tier not shown)."""
    values: dict[str, float] = dict.fromkeys(TIERS, 0.0)
    for line in metrics.splitlines():
        if line.startswith(name + "{") and 'tier="' in line:
            tier = line.split('tier="', 1)[1].split('"', 1)[0]
            values[tier] = float(line.rsplit(" ", 1)[1])
    return values


def hit_tokens(api: str) -> dict[str, float]:
    """Prompt tokens served from each cache tier so far (the engine's own counters: Strata's
    worker's, or vLLM's by the source Strata's connector reported for each)."""
    text = httpx.get(f"{api}/metrics", timeout=10).text
    if VLLM_CACHED not in text:
        return per_tier(text, "strata_worker_prefix_hit_tokens_total")
    tiers: dict[str, float] = dict.fromkeys(TIERS, 0.0)
    for line in text.splitlines():
        if line.startswith(VLLM_CACHED + "{") and 'source="' in line:
            tier = VLLM_SOURCES.get(line.split('source="', 1)[1].split('"', 1)[0])
            if tier is not None:
                tiers[tier] += float(line.rsplit(" ", 1)[1])
    return tiers


def held_blocks(kv_metrics: str) -> dict[str, float]:
    """Blocks the KV-tier sidecar holds per tier (committed ones: its index's size)."""
    return per_tier(httpx.get(f"{kv_metrics}/metrics", timeout=10).text, "strata_kvtier_blocks")
