"""The trace simulation: hit counting, the offline optimum, and agreement with the reference
figures in the traces' README."""

from __future__ import annotations

import json
import random

import pytest

from strata.worker.kvtier import reference
from strata.worker.kvtier.simulate import Cache, hit_ratio, load_trace, next_uses, optimal_hit_ratio, replay

from .conftest import TRACES


def test_hits_are_the_longest_cached_prefix():
    trace = [[1, 2, 3], [1, 2, 4], [9, 2, 3]]
    # request 2: 1,2 hit; request 3: 9 misses, so 2 and 3 do not count although cached.
    assert hit_ratio(trace, 100, "lru") == pytest.approx(2 / 9)


def test_capacity_limits_hits():
    trace = [[1, 2], [3, 4], [1, 2]]
    assert hit_ratio(trace, 2, "lru") == 0.0
    assert hit_ratio(trace, 4, "lru") == pytest.approx(2 / 6)
    assert optimal_hit_ratio(trace, 2) == pytest.approx(2 / 6)  # keeps 1,2 over 3,4


def test_next_uses():
    assert next_uses([[1, 2], [2], [1]]) == [[2, 1], [float("inf")], [float("inf")]]


def test_optimal_bounds_online_policies_on_random_chains():
    rng = random.Random(7)
    prefixes = [[rng.randrange(10_000) for _ in range(rng.randrange(1, 6))] for _ in range(40)]
    trace = [[*rng.choice(prefixes), rng.randrange(10000, 20000)] for _ in range(600)]
    for capacity in (5, 20, 60):
        best = optimal_hit_ratio(trace, capacity)
        for eviction in ("lru", "prefix-aware"):
            for admission in ("always", "doorkeeper", "adaptive"):
                assert hit_ratio(trace, capacity, eviction, admission, lookahead=4) <= best + 1e-12
        for peer in reference.PEERS.values():
            assert peer(trace, capacity) <= best + 1e-12
        ceiling = optimal_hit_ratio(trace, capacity, doorkeeper=True)
        assert ceiling <= best
        for eviction in ("lru", "prefix-aware"):
            assert hit_ratio(trace, capacity, eviction, "doorkeeper") <= ceiling + 1e-12
        with_queue = optimal_hit_ratio(trace, capacity, doorkeeper=True, lookahead=4)
        assert ceiling <= with_queue <= best
        remembering = optimal_hit_ratio(trace, capacity, doorkeeper=True, lookahead=4, remember_all=True)
        assert with_queue <= remembering <= best
        for eviction in ("lru", "prefix-aware"):
            assert hit_ratio(trace, capacity, eviction, "doorkeeper", lookahead=4) <= with_queue + 1e-12


def test_doorkeeper_ceiling_admits_on_the_second_sighting():
    trace = [[8, 9], [1, 2], [1, 2], [1, 2]]  # 8, 9 fill the cache: from then the doorkeeper decides
    assert optimal_hit_ratio(trace, 2) == pytest.approx(4 / 8)
    assert optimal_hit_ratio(trace, 2, doorkeeper=True) == pytest.approx(2 / 8)


def test_doorkeeper_ceiling_admits_every_block_while_there_is_room():
    assert optimal_hit_ratio([[1, 2], [1, 2]], 10, doorkeeper=True) == pytest.approx(2 / 4)


def test_remembering_every_sighting_admits_what_the_sketch_forgot():
    # The doorkeeper of a 1-block tier (7 fills it) remembers about 16 sightings: block 1, seen
    # again after 64 others, is a first sighting to it and never enters; a set remembers it, and
    # its third request hits.
    trace = [[7], [1], *([[k] for k in range(100, 164)]), [1], [1]]
    assert optimal_hit_ratio(trace, 1, doorkeeper=True) == 0
    assert optimal_hit_ratio(trace, 1, doorkeeper=True, remember_all=True) == pytest.approx(1 / len(trace))


def test_lookahead_ceiling_also_admits_what_a_queued_request_announced():
    trace = [[8, 9], [1, 2], [3], [1, 2], [1, 2]]  # 8, 9 fill the cache
    # Doorkeeper alone: 1, 2 enter on their second sighting (request 3), hit in request 4.
    assert optimal_hit_ratio(trace, 2, doorkeeper=True) == pytest.approx(2 / 9)
    # Request 3 is within two requests of request 1: announced, so 1, 2 enter at once.
    assert optimal_hit_ratio(trace, 2, doorkeeper=True, lookahead=2) == pytest.approx(4 / 9)
    assert optimal_hit_ratio(trace, 2, doorkeeper=True, lookahead=1) == pytest.approx(2 / 9)


def test_load_trace_names_bad_lines(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"hash_ids": [1, 2]}) + "\n" + json.dumps({"hash_ids": "x"}) + "\n")
    with pytest.raises(ValueError, match=r"t.jsonl:2: hash_ids"):
        load_trace(path)


@pytest.mark.skipif(not (TRACES / "mooncake_synthetic.jsonl").exists(), reason="traces not present")
def test_matches_readme_reference_on_synthetic_trace():
    trace = load_trace(TRACES / "mooncake_synthetic.jsonl")
    assert round(hit_ratio(trace, 5000, "lru"), 3) == 0.279
    assert round(optimal_hit_ratio(trace, 5000), 3) == 0.526


@pytest.mark.skipif(not (TRACES / "mooncake_synthetic.jsonl").exists(), reason="traces not present")
@pytest.mark.parametrize(("peer", "expected"), [("tail-first", 0.279), ("lfu", 0.262), ("s3-fifo", 0.273)])
def test_reference_peers_match_the_readme(peer, expected):
    trace = load_trace(TRACES / "mooncake_synthetic.jsonl")
    assert round(reference.PEERS[peer](trace, 5000), 3) == expected


def test_doorkeeper_refuses_one_use_blocks():
    cache = Cache(10, "lru", "doorkeeper")
    cache.request(list(range(100, 110)))  # fills it: from here the doorkeeper decides
    assert cache.request([1, 2]) == 0
    assert cache.request([1, 2]) == 0  # seen once before: admitted now
    assert cache.request([1, 2]) == 2
    assert 3 not in cache.index and cache.request([3]) == 0 and 3 not in cache.index


def one_use_noise_and_a_hot_set(length: int = 3000) -> list[list[int]]:
    """A small set of reused chains drowned in blocks used once: refusing them wins."""
    rng = random.Random(1)
    hot = [[rng.randrange(10**6) for _ in range(3)] for _ in range(8)]
    fresh = iter(range(10**6, 10**8))
    return [rng.choice(hot) if i % 2 else [next(fresh) for _ in range(6)] for i in range(length)]


def every_block_used_twice(length: int = 3000) -> list[list[int]]:
    """Each chain comes back once, shortly after: admitting at once wins."""
    trace: list[list[int]] = []
    for i in range(length // 2):
        trace.append([2 * i, 2 * i + 1])
        trace.append([2 * i, 2 * i + 1])
    return trace


@pytest.mark.parametrize("make_trace", [one_use_noise_and_a_hot_set, every_block_used_twice])
def test_adaptive_follows_whichever_admission_wins(make_trace):
    trace = make_trace()
    always = hit_ratio(trace, 30, "lru", "always")
    doorkeeper = hit_ratio(trace, 30, "lru", "doorkeeper")
    assert abs(always - doorkeeper) > 0.1  # the two traces pull in opposite directions
    assert hit_ratio(trace, 30, "lru", "adaptive") >= max(always, doorkeeper) - 0.02


def test_lookahead_keeps_what_queued_requests_need():
    # Capacity 2: [1, 2] is pushed out by [3, 4] unless the queue says it comes back.
    trace = [[1, 2], [3, 4], [1, 2]]
    assert replay(trace, Cache(2, "lru")) == 0.0
    assert replay(trace, Cache(2, "lru"), lookahead=2) == pytest.approx(2 / 6)
