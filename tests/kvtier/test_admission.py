"""Admission policies and the look-ahead in the tier index: pure bookkeeping, no bytes."""

from __future__ import annotations

import pytest

from strata.worker.kvtier.admission import (
    Adaptive,
    Always,
    Doorkeeper,
    FrequencySketch,
    make_admission,
    stable_hash,
)
from strata.worker.kvtier.index import Entry, TierIndex
from strata.worker.kvtier.simulate import Cache


@pytest.mark.parametrize(("most", "halved"), [(3, (1, 1)), (15, (7, 8)), (255, (127, 128))])
def test_sketch_counts_saturates_and_ages(most: int, halved: tuple[int, int]):
    sketch = FrequencySketch(sample_size=1000, most=most)
    for _ in range(300):
        sketch.increment("hot")
    assert sketch.estimate("hot") == most  # saturates at its ceiling, never wraps
    assert sketch.estimate("cold") == 0
    sketch.increment("once")
    for i in range(1000):  # enough other sightings to halve everything once
        sketch.increment(i)
    assert sketch.estimate("once") == 0  # a single old sighting is forgotten
    assert halved[0] <= sketch.estimate("hot") <= halved[1]


@pytest.mark.parametrize("most", [3, 255])
def test_sketch_never_counts_a_key_below_its_sightings(most: int):
    """Count-min's promise, in a sketch crowded enough that keys share bytes (packed: four rows'
    counters to a byte): an estimate is at least the key's sightings (up to the ceiling), so an
    increment never carries into, or takes from, a neighbour's counter."""
    sketch = FrequencySketch(sample_size=4096, most=most)
    sightings = {key: 1 + key % 5 for key in range(800)}
    for round_ in range(5):
        for key, times in sightings.items():
            if round_ < times:
                sketch.increment(key)
    assert all(sketch.estimate(key) >= min(times, most) for key, times in sightings.items())
    assert max(sketch.estimate(key) for key in sightings) <= most


def test_packed_halving_halves_each_of_a_bytes_four_counters():
    sketch = FrequencySketch(sample_size=16, most=3)
    sketch._table[:] = bytes(range(256))[: len(sketch._table)]
    before = bytes(sketch._table)
    sketch._added = 15
    sketch.increment("tips it over")  # the 16th sighting: everything halves
    for old, new in zip(before, sketch._table, strict=True):
        for shift in (0, 2, 4, 6):
            was, now = (old >> shift) & 3, (new >> shift) & 3
            # halved (one field may also hold the increment just made, before the halving)
            assert now in {was >> 1, min(was + 1, 3) >> 1}


def test_sketch_memory_is_bounded_by_its_sample_size():
    packed, wide = FrequencySketch(sample_size=1000), FrequencySketch(sample_size=1000, most=255)
    assert (len(packed._table), len(wide._table)) == (2048, 4 * 2048)  # 2 bits, 8 bits x 4 rows
    for i in range(100_000):
        packed.increment(i)
        wide.increment(i)
    assert (len(packed._table), len(wide._table)) == (2048, 4 * 2048)
    with pytest.raises(ValueError, match="most"):
        FrequencySketch(sample_size=1000, most=256)


@pytest.mark.parametrize("most", [3, 255])
def test_a_sketch_too_large_for_its_budget_is_narrower_and_still_counts(most: int):
    sketch = FrequencySketch(sample_size=1_000_000, most=most, max_bytes=4096)
    assert len(sketch._table) == 4096  # not the 2 MiB (or 8 MiB) the sample size asks for
    for _ in range(2):
        sketch.increment("twice")
    assert sketch.estimate("twice") >= 2


def test_stable_hash_is_the_same_in_every_process_and_spreads_small_ints():
    key = bytes(range(16))
    assert stable_hash(key) == stable_hash(bytes(range(16)))
    assert len({stable_hash(i) >> 60 for i in range(64)}) > 8


def test_doorkeeper_admits_on_the_second_sighting():
    gate = Doorkeeper(capacity=100)
    assert not gate.admits("a", None)
    assert gate.admits("a", None)
    gate.record_hit("b", None)  # a hit is a sighting too
    assert gate.admits("b", None)


def test_always_admits_everything():
    assert Always().admits("anything", None)


def test_adaptive_switches_to_the_doorkeeper_when_it_wins():
    cache = Cache(8, "lru", "adaptive")
    gate = cache.index.admission
    assert isinstance(gate, Adaptive) and not gate.using_doorkeeper  # no evidence: admit all
    for i in range(2000):  # 6 hot blocks, each back after 11 others: LRU of 8 keeps none
        cache.request([("hot", (i // 2) % 6)] if i % 2 else [("noise", i)])
    assert gate.using_doorkeeper


def test_unknown_admission_is_named():
    with pytest.raises(ValueError, match="admission: unknown policy 'sometimes'"):
        make_admission("sometimes", 10, "lru")


def entry(parent: object = None) -> Entry:
    return Entry(parent=parent, priority=0, pinned=False, last_used=0.0)


@pytest.mark.parametrize("eviction", ["lru", "prefix-aware"])
def test_expected_blocks_are_never_evicted_until_unexpected(eviction):
    index = TierIndex(2, eviction)
    index.add("queued", entry())
    index.add("other", entry())
    index.touch("queued", 1.0)  # LRU would take "other" first anyway: make "queued" oldest
    index.touch("other", 2.0)
    index.expect(["queued"])
    index.expect(["queued"])  # two queued requests share it
    assert [k for k, _ in index.make_room(2)] == ["other"]
    index.unexpect(["queued"])
    assert index.make_room(2) == []  # still expected once
    index.unexpect(["queued"])
    assert [k for k, _ in index.make_room(2)] == ["queued"]


def test_expected_blocks_are_always_admitted_and_arrive_protected():
    index = TierIndex(1, "lru", "doorkeeper")
    index.add("held", entry())  # full: admission decides
    assert not index.admits("new", None)  # first sighting
    index.expect(["later"])
    assert index.admits("later", None)  # first sighting, but a queued request needs it
    index.make_room(1)
    index.add("later", entry())
    assert index.make_room(1) == []


def test_a_tier_with_room_admits_every_block():
    index = TierIndex(2, "lru", "doorkeeper")
    assert index.admits("first", None)  # a first sighting, but refusing it would evict nothing
    index.add("first", entry())
    assert index.admits("second", None)
    index.add("second", entry())
    assert not index.admits("third", None)  # full: the doorkeeper decides
    assert (index.admitted, index.refused) == (2, 1)
    assert index.admits("third", None)  # its second sighting


def test_expected_blocks_do_not_expire():
    index = TierIndex(2, "lru")
    index.add("queued", entry())
    index.expect(["queued"])
    assert index.expired(now=100.0, retention_s=1.0) == []


def test_prefix_aware_keeps_an_expected_parent_a_parent():
    index = TierIndex(3, "prefix-aware")
    index.add("head", entry())
    index.add("tail", entry("head"))
    index.expect(["tail"])
    # "tail" is protected, so "head" (its parent) is not a leaf and nothing may go.
    assert index.make_room(3) == []
