"""Small scenarios for the simulator's tests: a profile with round numbers, and services."""

from __future__ import annotations

from typing import Any

from strata.sim.profile import Profile, ReadBandwidth
from strata.sim.scenario import load_tiers
from strata.sim.service import Service, ServiceConfig
from strata.sim.trace import Request, Trace

TIERS = load_tiers()

# Round numbers so that expected times can be computed by hand: a step costs 10 ms plus 1 ms per
# 1,000 prompt tokens; decode adds 1 ms per sequence; blocks are 100 tokens of 1 MB.
FLAT = Profile(
    name="flat",
    kv_bytes_per_token=10_000,
    kv_cache_bytes=100 * 100 * 10_000,  # 100 blocks of 100 tokens
    max_batched_tokens=1000,
    max_num_seqs=8,
    max_queue_len=4,
    queue_timeout_s=5.0,
    overhead_s=0.010,
    floor_s=0.0,
    prefill_token_s=1e-6,
    attention_pair_s=0.0,
    decode_seq_s=0.001,
    decode_context_token_s=0.0,
    read_gbps=ReadBandwidth(dram=1.0, nvme=0.1, shared=0.05),
    read_latency_s=0.0,
    startup_s=30.0,
)


def trace(*requests: tuple[float, int, int, tuple[int, ...]]) -> Trace:
    return Trace("test", 100, tuple(Request(t, i, o, b) for t, i, o, b in requests))


def service(t: Trace, tier: str = "standard", profile: Profile = FLAT, **config: Any) -> Service:
    return Service(ServiceConfig(tier, tier, t, **config), TIERS[tier], profile)
