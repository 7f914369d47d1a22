"""Block events: the snapshot-then-changes stream, its wire format, and the hooks in the HBM block
manager and the sidecar's tier index that feed it."""

from __future__ import annotations

import threading

import pytest

from strata.worker import block_events
from strata.worker.block_events import BadEvent, BlockEvents, parse_line
from strata.worker.engine.block_manager import BlockManager
from strata.worker.kv_connector import BlockRef
from strata.worker.kvtier.index import Entry, TierIndex


def k(i: int) -> bytes:
    return i.to_bytes(16, "big")


def events_of(lines: list[str]) -> list[block_events.Event]:
    return [parse_line(line) for line in lines]


def test_a_subscriber_gets_the_snapshot_then_each_change_batched_in_order():
    hub = BlockEvents()
    hub.stored("hbm", [k(1), k(2)])
    hub.stored("dram", [k(3)])
    woken = threading.Event()
    sub = hub.subscribe(woken.set)
    assert woken.is_set()
    hub.stored("hbm", [k(4)])
    hub.stored("hbm", [k(5)])
    hub.removed("hbm", [k(1)])
    got = events_of(sub.drain())
    snapshot = {e.tier: set(e.blocks) for e in got if e.kind == "snapshot"}
    assert snapshot == {"hbm": {k(1), k(2)}, "dram": {k(3)}}
    kinds = [e.kind for e in got]
    assert kinds.index("synced") < kinds.index("stored")
    changes = [(e.kind, e.tier, e.blocks) for e in got if e.kind in ("stored", "removed")]
    assert changes == [("stored", "hbm", (k(4), k(5))), ("removed", "hbm", (k(1),))]
    assert sub.drain() == []


def test_only_real_changes_go_out_and_unsubscribed_followers_get_nothing():
    hub = BlockEvents()
    sub = hub.subscribe(lambda: None)
    sub.drain()
    hub.stored("nvme", [k(1)])
    hub.stored("nvme", [k(1)])  # already held
    hub.removed("nvme", [k(9)])  # never held
    assert [e.kind for e in events_of(sub.drain())] == ["stored"]
    hub.unsubscribe(sub)
    hub.stored("nvme", [k(2)])
    assert sub.drain() == []
    assert hub.held("nvme") == {k(1), k(2)}


def test_a_follower_too_far_behind_is_cut_off_to_start_again_from_a_snapshot():
    hub = BlockEvents()
    sub = hub.subscribe(lambda: None)
    sub.limit = 3
    hub.stored("hbm", [k(i) for i in range(5)])
    assert sub.overflowed


def test_a_closed_event_loop_never_breaks_the_producer():
    def closed() -> None:
        raise RuntimeError("Event loop is closed")

    hub = BlockEvents()
    hub.subscribe(closed)
    hub.stored("hbm", [k(1)])  # no exception in the engine's thread
    assert hub.held("hbm") == {k(1)}


def test_the_ping_carries_the_producers_status():
    hub = BlockEvents(status=lambda: {"pending_tokens": 12, "kv_usage": 0.5})
    ping = parse_line(hub.ping_line())
    assert ping.kind == "ping" and ping.status == {"pending_tokens": 12, "kv_usage": 0.5}


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("not json", "not a block event"),
        ('{"event": "gossip"}', "unknown kind"),
        ('{"event": "stored", "tier": "tape", "blocks": []}', "tier"),
        ('{"event": "stored", "tier": "hbm", "blocks": ["zz"]}', "not a block event"),
        ('{"event": "ping", "status": 3}', "status"),
    ],
)
def test_garbage_lines_are_refused_by_name(line, reason):
    with pytest.raises(BadEvent, match=reason):
        parse_line(line)


def test_follow_writes_snapshot_and_changes_until_stopped():
    hub = BlockEvents()
    hub.stored("dram", [k(1)])
    written: list[bytes] = []
    got_change = threading.Event()
    stop = threading.Event()

    def write(data: bytes) -> None:
        written.append(data)
        if b'"stored"' in data:
            got_change.set()

    thread = threading.Thread(target=block_events.follow, args=(hub, write, stop))
    thread.start()
    hub.stored("dram", [k(2)])
    assert got_change.wait(30)
    stop.set()
    thread.join(30)
    assert not thread.is_alive()
    lines = b"".join(written).decode().splitlines()
    assert [parse_line(line).kind for line in lines][:3] == ["snapshot", "synced", "stored"]


def test_the_hbm_block_manager_reports_registrations_and_evictions():
    hub = BlockEvents()
    blocks = BlockManager(2, 4)
    first = blocks.allocate()
    blocks.register(first, BlockRef(k(1), k(0), 0), [1, 2, 3, 4])
    blocks.attach(hub)  # what is cached already is reported on attach
    assert hub.held("hbm") == {k(1)}
    second = blocks.allocate()
    blocks.register(second, BlockRef(k(2), k(1), 1), [5, 6, 7, 8])
    blocks.release([first, second])
    blocks.allocate()  # reuses the least recently released cached block: an eviction
    assert len(hub.held("hbm")) == 1


def test_a_tier_index_reports_adds_and_removals_but_not_pins():
    hub = BlockEvents()
    index = TierIndex(2, "lru")
    index.add(k(1), Entry(None, 0, False, 0.0))
    index.watch(hub, "dram")
    index.add(k(2), Entry(k(1), 0, False, 1.0))
    sub = hub.subscribe(lambda: None)
    sub.drain()
    index.pin(k(1))
    index.make_room()  # evicts the unpinned k(2)
    assert [(e.kind, e.blocks) for e in events_of(sub.drain())] == [("removed", (k(2),))]
    assert hub.held("dram") == {k(1)}


def test_a_tracked_tier_is_read_from_its_index_at_each_snapshot():
    """A sidecar's tiers: the snapshot is what the index holds when a follower subscribes, and
    changes follow it; the hub keeps no copy of millions of keys."""
    hub = BlockEvents()
    index = TierIndex(4, "prefix-aware")
    index.add(k(1), Entry(None, 0, False, 0.0))
    index.watch(hub, "nvme")
    index.add(k(2), Entry(k(1), 0, False, 1.0))
    first = hub.subscribe(lambda: None)
    assert {b for e in events_of(first.drain()) if e.kind == "snapshot" for b in e.blocks} == {k(1), k(2)}
    index.remove(k(2))
    index.add(k(3), Entry(k(1), 0, False, 2.0))
    changes = [(e.kind, e.blocks) for e in events_of(first.drain())]
    assert changes == [("removed", (k(2),)), ("stored", (k(3),))]
    second = hub.subscribe(lambda: None)
    assert {b for e in events_of(second.drain()) if e.kind == "snapshot" for b in e.blocks} == {k(1), k(3)}
    assert hub.held("nvme") == {k(1), k(3)}


def test_a_large_snapshot_goes_out_a_few_lines_at_each_wake_up(monkeypatch):
    """Following a tier of millions of blocks builds its lines piece by piece, the writer woken
    again for each; changes meanwhile wait behind the synced line."""
    monkeypatch.setattr(block_events, "LINE_BLOCKS", 3)
    monkeypatch.setattr(block_events, "SNAPSHOT_LINES", 2)
    hub = BlockEvents()
    hub.stored("hbm", [k(i) for i in range(10)])  # 4 lines of at most 3
    wakes: list[int] = []
    sub = hub.subscribe(lambda: wakes.append(1))
    hub.stored("hbm", [k(10)])
    pieces: list[list[block_events.Event]] = []
    while not pieces or pieces[-1]:
        before = len(wakes)
        pieces.append(events_of(sub.drain()))
        assert len(pieces) < 10
        if pieces[-1] and pieces[-1][-1].kind == "snapshot":
            assert len(pieces[-1]) == 2 and len(wakes) == before + 1  # woken again for the rest
    kinds = [e.kind for piece in pieces for e in piece]
    assert kinds == ["snapshot"] * 4 + ["synced", "stored"]
    assert {b for piece in pieces for e in piece if e.kind == "snapshot" for b in e.blocks} == {
        k(i) for i in range(10)
    }
