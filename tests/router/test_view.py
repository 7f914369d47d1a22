"""An endpoint's block view: exact from synced streams, the router's own record when a stream is
down, shared-tier blocks pooled across endpoints."""

from __future__ import annotations

from strata.router.choose import Tier
from strata.router.view import BlockView, SharedPool
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
