"""The trace simulation: hit counting, the offline optimum, and agreement with the reference
figures in the traces' README."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

from strata.worker.kvtier.simulate import hit_ratio, load_trace, next_uses, optimal_hit_ratio

TRACES = Path(os.environ.get("STRATA_TRACES_DIR", Path(__file__).parents[2] / "../shared/data/traces"))


def test_hits_are_the_longest_cached_prefix():
    trace = [[1, 2, 3], [1, 2, 4], [9, 2, 3]]
    # request 2: 1,2 hit; request 3: 9 misses, so 2 and 3 do not count although cached.
    assert hit_ratio(trace, "lru", 100) == pytest.approx(2 / 9)


def test_capacity_limits_hits():
    trace = [[1, 2], [3, 4], [1, 2]]
    assert hit_ratio(trace, "lru", 2) == 0.0
    assert hit_ratio(trace, "lru", 4) == pytest.approx(2 / 6)
    assert optimal_hit_ratio(trace, 2) == pytest.approx(2 / 6)  # keeps 1,2 over 3,4


def test_next_uses():
    assert next_uses([[1, 2], [2], [1]]) == [[2, 1], [float("inf")], [float("inf")]]


def test_optimal_bounds_online_policies_on_random_chains():
    rng = random.Random(7)
    prefixes = [[rng.randrange(10_000) for _ in range(rng.randrange(1, 6))] for _ in range(40)]
    trace = [[*rng.choice(prefixes), rng.randrange(10000, 20000)] for _ in range(600)]
    for capacity in (5, 20, 60):
        best = optimal_hit_ratio(trace, capacity)
        for policy in ("lru", "prefix-aware"):
            assert hit_ratio(trace, policy, capacity) <= best + 1e-12


def test_load_trace_names_bad_lines(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"hash_ids": [1, 2]}) + "\n" + json.dumps({"hash_ids": "x"}) + "\n")
    with pytest.raises(ValueError, match=r"t.jsonl:2: hash_ids"):
        load_trace(path)


@pytest.mark.skipif(not (TRACES / "mooncake_synthetic.jsonl").exists(), reason="traces not present")
def test_matches_readme_reference_on_synthetic_trace():
    trace = load_trace(TRACES / "mooncake_synthetic.jsonl")
    assert round(hit_ratio(trace, "lru", 5000), 3) == 0.279
    assert round(optimal_hit_ratio(trace, 5000), 3) == 0.526
