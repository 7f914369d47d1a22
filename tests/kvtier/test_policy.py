"""Eviction orders and the tier index: pure bookkeeping, no bytes."""

from __future__ import annotations

import pytest

from strata.worker.kvtier.index import Entry, TierIndex
from strata.worker.kvtier.policy import LruOrder, PrefixAwareOrder, make_order


def entry(parent: int | None = None, priority: int = 0, pinned: bool = False, now: float = 0.0) -> Entry:
    return Entry(parent=parent, priority=priority, pinned=pinned, last_used=now)


def fill(index: TierIndex, chain: list[int], now: float = 0.0) -> None:
    parent = None
    for key in chain:
        index.add(key, entry(parent, now=now))
        parent = key


def test_lru_evicts_least_recently_used():
    index = TierIndex(3, "lru")
    fill(index, [1, 2, 3])
    index.touch(1, 1.0)
    assert [k for k, _ in index.make_room(2)] == [2, 3]


def test_prefix_aware_evicts_chain_ends_before_heads():
    index = TierIndex(6, "prefix-aware")
    fill(index, [1, 2, 3])  # an older chain
    fill(index, [10, 11, 12])
    for key in (1, 2, 3):  # the first chain touched last, root first as a prefix lookup does
        index.touch(key, 1.0)
    # LRU would take 10 (the head of the second chain) first and strand 11 and 12.
    assert [k for k, _ in index.evict(4)] == [12, 11, 10, 3]


def test_prefix_aware_keeps_shared_head_until_its_children_go():
    order = PrefixAwareOrder()
    order.add("system", None, 0, 1, True)
    order.add("a", "system", 0, 2, True)
    order.add("b", "system", 0, 3, True)
    assert order.victim() == "a"
    order.remove("a")
    assert order.victim() == "b"
    order.remove("b")
    assert order.victim() == "system"


def test_parent_returning_after_its_child_is_not_a_leaf():
    order = PrefixAwareOrder()
    order.add("child", "parent", 0, 1, True)
    order.add("parent", None, 0, 2, True)
    assert order.victim() == "child"


@pytest.mark.parametrize("policy", ["lru", "prefix-aware"])
def test_lower_priority_goes_first_and_pinned_never(policy):
    index = TierIndex(3, policy)
    index.add("pinned", entry(pinned=True))
    index.add("gold", entry(priority=10))
    index.add("bronze", entry(priority=0))
    index.touch("bronze", 5.0)  # most recent, but lowest priority
    assert [k for k, _ in index.evict(5)] == ["bronze", "gold"]
    assert "pinned" in index


def test_pin_makes_a_present_block_unevictable():
    index = TierIndex(2, "lru")
    fill(index, [1, 2])
    index.pin(1)
    assert [k for k, _ in index.evict(2)] == [2]


def test_expired_lists_blocks_past_retention_oldest_first():
    index = TierIndex(4, "lru")
    index.add("old", entry(now=0.0))
    index.add("pinned-old", entry(now=0.0, pinned=True))
    index.add("new", entry(now=50.0))
    assert index.expired(now=100.0, retention_s=60.0) == ["old"]


def test_add_without_room_is_refused():
    index = TierIndex(1, "lru")
    index.add(1, entry())
    with pytest.raises(OverflowError):
        index.add(2, entry())
    roomy = TierIndex(2, "lru")
    roomy.add(1, entry())
    with pytest.raises(KeyError):
        roomy.add(1, entry())


def test_unknown_policy_is_named():
    with pytest.raises(ValueError, match="unknown policy 'mru'"):
        make_order("mru")
    assert isinstance(make_order("lru"), LruOrder)


def test_prefix_aware_heap_stays_bounded_under_touches():
    order = PrefixAwareOrder()
    order.add("a", None, 0, 0, True)
    for tick in range(1, 20_000):
        order.touch("a", tick)
    assert len(order._heap) < 2_000
    assert order.victim() == "a"


def test_lru_keeps_recency_within_each_priority_class():
    order = LruOrder()
    for tick, (key, priority) in enumerate([("a", 1), ("b", 0), ("c", 1), ("d", 0)]):
        order.add(key, None, priority, tick, True)
    order.touch("b", 5)
    order.touch("a", 6)
    order.touch("missing", 7)  # not held: nothing happens
    victims = []
    while (victim := order.victim()) is not None:
        victims.append(victim)
        order.remove(victim)
    assert victims == ["d", "b", "c", "a"]
