"""The routing benchmark's trace replay: hit counting, windows, and the policies' behaviour on a
small multi-turn workload (the full traces run in `python -m bench routing`)."""

from __future__ import annotations

import json
import random

import pytest

from bench import routing_sim
from bench.routing_sim import BLOCK_TOKENS, Request, Tally, load_requests, replay
from strata.router.choose import Policy


def conversations(n_convs: int = 24, turns: int = 6, seed: int = 1) -> list[Request]:
    """Interleaved multi-turn conversations: each turn's chain extends the previous turn's."""
    rng = random.Random(seed)
    chains = {c: [c * 1000 + i for i in range(3)] for c in range(n_convs)}
    out: list[Request] = []
    order = [c for c in range(n_convs) for _ in range(turns)]
    rng.shuffle(order)
    for t, c in enumerate(order):
        chains[c] = chains[c] + [c * 1000 + len(chains[c]) + i for i in range(2)]
        out.append(Request(t * 2.0, len(chains[c]) * BLOCK_TOKENS - 100, tuple(chains[c])))
    return out


def test_hits_are_the_cached_prefix_and_imbalance_is_max_over_mean_per_window():
    requests = [
        Request(0.0, 3 * BLOCK_TOKENS, (1, 2, 3)),
        Request(1.0, 3 * BLOCK_TOKENS, (1, 2, 4)),
        Request(61.0, BLOCK_TOKENS, (9,)),  # the last window: left out of the imbalance
    ]
    result = replay(requests, 1, 100, routing_sim.round_robin())
    assert result["hit_ratio"] == pytest.approx(2 / 7, abs=1e-4)
    assert result["imbalance_p95"] == 1.0
    tally = Tally()
    tally.add(0, 2, 0, Request(0.0, 300, (1,)), 300)
    tally.add(1, 2, 0, Request(1.0, 100, (2,)), 100)
    tally.add(0, 2, 0, Request(70.0, 1, (3,)), 1)
    assert tally.result()["imbalance_p95"] == pytest.approx(300 / 200)


def test_strata_keeps_conversations_together_without_unbalancing_the_fleet():
    requests = conversations()
    results = {name: replay(requests, 4, 60, make()) for name, make in routing_sim.pickers(Policy()).items()}
    assert results["strata"]["hit_ratio"] > 1.5 * results["random"]["hit_ratio"]
    assert results["strata"]["hit_ratio"] > 1.5 * results["least-load"]["hit_ratio"]
    assert results["strata"]["imbalance_p95"] < results["prefix-only"]["imbalance_p95"]


def test_trace_records_are_read_and_bad_ones_named(tmp_path):
    good = tmp_path / "t.jsonl"
    good.write_text(json.dumps({"timestamp": 1500, "input_length": 600, "hash_ids": [4, 5]}) + "\n\n")
    assert load_requests(good) == [Request(1.5, 600, (4, 5))]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1: not a trace record"):
        load_requests(bad)
