"""An endpoint's block view: exact from synced streams, the router's own record when a stream is
down, shared-tier blocks pooled across endpoints, lower-tier keys within one follow budget."""

from __future__ import annotations

from strata.common.routermemory import FOLLOWED_BYTES_PER_KEY, followed_limit, memory_to_follow
from strata.common.tiers import Tier
from strata.router.view import BlockView, FollowBudget, SharedPool
from strata.worker.block_events import Event


def k(i: int) -> bytes:
    return i.to_bytes(16, "big")


def lookup_at(view: BlockView, blocks: list[bytes], now: float = 100.0) -> list[Tier]:
    return view.lookup(blocks, now)


def synced(view: BlockView, source: str, **tiers: list[int]) -> None:
    for tier, keys in tiers.items():
        view.apply(source, Event("snapshot", tier, tuple(k(i) for i in keys)))
    view.apply(source, Event("synced"))


def test_lookup_reports_the_fastest_tier_holding_each_leading_block():
    view = BlockView(SharedPool(), 100)
    synced(view, "worker", hbm=[0])
    synced(view, "sidecar", dram=[1], nvme=[2, 0])
    assert lookup_at(view, [k(0), k(1), k(2), k(3)]) == ["hbm", "dram", "nvme"]
    view.apply("sidecar", Event("removed", "dram", (k(1),)))
    assert lookup_at(view, [k(0), k(1), k(2)]) == ["hbm"]  # stops at the first miss
    view.apply("worker", Event("stored", "hbm", (k(1),)))
    assert lookup_at(view, [k(0), k(1), k(2)]) == ["hbm", "hbm", "nvme"]


def test_a_new_snapshot_replaces_what_the_source_reported_before():
    view = BlockView(SharedPool(), 100)
    synced(view, "worker", hbm=[0, 1])
    synced(view, "sidecar")
    synced(view, "worker", hbm=[5])  # the worker restarted: its HBM is what it says now
    assert lookup_at(view, [k(0)]) == []
    assert lookup_at(view, [k(5)]) == ["hbm"]
    synced(view, "worker")  # an empty snapshot empties the view
    assert lookup_at(view, [k(5)]) == []


def test_while_a_stream_is_down_the_routers_own_record_stands_in():
    view = BlockView(SharedPool(), 3)
    view.routed([k(0), k(1), k(2), k(3)], now=0.0)  # remembers the 3 most recent
    synced(view, "worker", hbm=[9])
    synced(view, "sidecar")
    assert lookup_at(view, [k(1), k(2)]) == []  # streams synced: exact, the record unused
    assert lookup_at(view, [k(1), k(2)], now=3.0) == ["hbm", "hbm"]  # unless just routed
    view.reset("sidecar")
    assert lookup_at(view, [k(1), k(2), k(3)]) == ["hbm", "hbm", "hbm"]
    assert lookup_at(view, [k(0)]) == []  # forgotten: the record is bounded


def test_shared_blocks_count_for_every_endpoint_until_their_writer_drops_them():
    pool = SharedPool()
    writer, reader = BlockView(pool, 10), BlockView(pool, 10)
    for view in (writer, reader):
        synced(view, "worker")
    synced(writer, "sidecar", shared=[7])
    synced(reader, "sidecar")
    assert lookup_at(reader, [k(7)]) == ["shared"]
    writer.reset("sidecar")  # its stream went down: what it reported is forgotten
    assert lookup_at(reader, [k(7)]) == []


def test_lower_tier_keys_past_the_follow_budget_are_not_followed():
    """All endpoints' DRAM, NVMe and shared keys share one budget; HBM keys are always
    followed; what a removal or a reset frees is followed again."""
    budget = FollowBudget(limit=4)
    pool = SharedPool()
    a, b = BlockView(pool, 10, budget), BlockView(pool, 10, budget)
    synced(a, "worker", hbm=[0, 1, 2, 3])  # HBM: not counted
    synced(a, "sidecar", dram=[10, 11], shared=[20])
    synced(b, "worker")
    synced(b, "sidecar", nvme=[30, 31])  # one fits
    assert budget.followed == 4 and budget.refused == 1
    assert lookup_at(a, [k(0), k(1), k(2), k(3)]) == ["hbm"] * 4
    assert lookup_at(b, [k(30), k(31)]) == ["nvme"]  # 31 not followed: a miss
    assert lookup_at(b, [k(20)]) == ["shared"]
    a.apply("sidecar", Event("removed", "dram", (k(10), k(99))))  # 99 was never held
    assert budget.followed == 3
    b.apply("sidecar", Event("stored", "nvme", (k(31),)))
    assert lookup_at(b, [k(30), k(31)]) == ["nvme", "nvme"] and budget.followed == 4
    a.reset("sidecar")  # its DRAM block 11 and shared block 20
    assert budget.followed == 2 and lookup_at(b, [k(20)]) == []


def test_the_follow_budget_is_half_the_routers_memory():
    assert followed_limit(None) is None
    assert followed_limit(1 << 30) == (1 << 29) // FOLLOWED_BYTES_PER_KEY  # 3.4M keys in 1 GiB
    assert FollowBudget().take(10**9) == 10**9  # no limit known: everything is followed
    # ... and the operator's memory for a known count of keys is its exact inverse.
    for keys in (1, 3_355_443, 5_774_592):
        assert followed_limit(memory_to_follow(keys)) == keys
        assert (followed_limit(memory_to_follow(keys) - FOLLOWED_BYTES_PER_KEY) or 0) < keys


def test_the_routers_records_share_the_budget_and_shrink_rather_than_grow_past_it():
    budget = FollowBudget(limit=5)
    a, b = BlockView(SharedPool(), 100, budget), BlockView(SharedPool(), 100, budget)
    synced(a, "sidecar", dram=[50, 51])  # 2 followed
    a.routed([k(0), k(1), k(2)], now=0.0)  # 3 recorded: the budget is spent
    assert (budget.followed, budget.recorded, budget.full) == (2, 3, True)
    a.routed([k(3)], now=1.0)  # a new block takes the oldest one's place
    assert list(a.record) == [k(1), k(2), k(3)] and budget.recorded == 3
    b.routed([k(9)], now=1.0)  # an empty record gets nothing while the budget is spent
    assert not b.record
    a.routed([k(2)], now=2.0)  # a block already recorded is refreshed, at no cost
    assert list(a.record) == [k(1), k(3), k(2)]
    a.forget()  # the endpoint went: all it held is given back
    assert (budget.followed, budget.recorded) == (0, 0)
    b.routed([k(9)], now=3.0)
    assert list(b.record) == [k(9)]
