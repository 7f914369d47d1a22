"""The save pipeline through a staging area: a put's reply waits for its blocks to be durable,
while the connection reads on and queues the next batch's writes behind them; a reserve waits
for staging slots that puts in flight still hold; other requests see every put before them.
Also the index log's compaction check and the length of a load's answers from a lower tier."""

from __future__ import annotations

import select
import socket
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from strata.worker.kvtier import protocol
from strata.worker.kvtier.nvme import NvmeStore, Record, decode_log, log_outgrown
from strata.worker.kvtier.service import KVTierService, Owner, PutBlock, staging_budget
from strata.worker.kvtier.tiers import NvmeTier

from .conftest import kvtier_config

BLOCK = 4096
WAIT_S = 120  # generous: these wait on events, never on the clock


class Gate:
    """Holds every NVMe commit (the fdatasync and the index log) until opened, and records
    which blocks' data writes have started meanwhile."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.open = threading.Event()
        self.syncing = threading.Event()
        self.written: list[bytes] = []
        self.wrote = threading.Condition()
        real_commit, real_pwrite = NvmeStore.commit, NvmeStore._pwrite

        def commit(store: NvmeStore, records: Sequence[Record]) -> list[Record]:
            self.syncing.set()
            assert self.open.wait(WAIT_S), "the test never opened the gate"
            return real_commit(store, records)

        def pwrite(store: NvmeStore, record: Record, data: memoryview) -> Record:
            done = real_pwrite(store, record, data)
            with self.wrote:
                self.written.append(record.key)
                self.wrote.notify_all()
            return done

        monkeypatch.setattr(NvmeStore, "commit", commit)
        monkeypatch.setattr(NvmeStore, "_pwrite", pwrite)

    def wait_written(self, keys: Sequence[bytes]) -> bool:
        with self.wrote:
            return self.wrote.wait_for(lambda: set(keys) <= set(self.written), WAIT_S)


def hexes(numbers: Sequence[int]) -> list[str]:
    return [n.to_bytes(16, "big").hex() for n in numbers]


@pytest.fixture
def sock(root, start_sidecar) -> Iterator[socket.socket]:
    """A connection to a sidecar without DRAM: every saved block passes a staging slot."""
    start_sidecar(kvtier_config(root, dram={"capacity_bytes": 0}), block_bytes=BLOCK)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(WAIT_S)
    conn.connect(str(root / "kv.sock"))
    yield conn
    conn.close()


def call(conn: socket.socket, message: dict[str, Any]) -> dict[str, Any]:
    protocol.send(conn, message)
    reply = protocol.receive(conn)
    assert reply is not None and reply["ok"], reply
    return reply


def reserved(service: KVTierService, owner: Owner, numbers: Sequence[int]) -> list[PutBlock]:
    """Reserve slots for blocks ``numbers``: the put of those that got one (left as zeros)."""
    keys = [n.to_bytes(16, "big") for n in numbers]
    slots = service.reserve(owner, keys)
    return [PutBlock(k, b"\0" * 16, s) for k, s in zip(keys, slots, strict=True) if s is not None]


def save(service: KVTierService, numbers: Sequence[int]) -> int:
    owner = Owner()
    return service.put(owner, reserved(service, owner, numbers))


def put_message(numbers: Sequence[int], slots: Sequence[int]) -> dict[str, Any]:
    return {"op": "put", "keys": hexes(numbers), "parents": hexes([0] * len(numbers)), "slots": list(slots)}


def test_next_batch_is_written_while_a_put_is_synced_and_replies_wait_for_durability(sock, monkeypatch):
    gate = Gate(monkeypatch)
    first, second = [1, 2, 3, 4], [5, 6, 7, 8]
    slots = call(sock, {"op": "reserve", "keys": hexes(first)})["slots"]
    protocol.send(sock, put_message(first, slots))
    assert gate.syncing.wait(WAIT_S)  # the first batch is written; its commit is held
    protocol.send(sock, {"op": "reserve", "keys": hexes(second)})
    protocol.send(sock, {"op": "put", "keys": hexes(second)})  # refused: no parents, no slots
    protocol.send(sock, {"op": "lookup", "keys": hexes(first)})  # must see the first put
    # Replies go in request order: none before the first put's, which waits for durability.
    assert select.select([sock], [], [], 0)[0] == [], "a reply came before the put was durable"
    gate.open.set()
    assert protocol.receive(sock) == {"ok": True, "stored": 4}
    second_slots = protocol.receive(sock)
    assert second_slots is not None and len(second_slots["slots"]) == 4, second_slots
    refused = protocol.receive(sock)
    assert refused is not None and not refused["ok"] and "parents" in refused["error"], refused
    assert protocol.receive(sock) == {"ok": True, "tiers": ["nvme"] * 4}


def test_a_batch_is_queued_on_the_disk_before_the_put_before_it_is_committed(sock, monkeypatch):
    gate = Gate(monkeypatch)
    first, second = [1, 2, 3, 4], [5, 6, 7, 8]
    slots = call(sock, {"op": "reserve", "keys": hexes(first)})["slots"]
    protocol.send(sock, {"op": "reserve", "keys": hexes(second)})
    protocol.send(sock, put_message(first, slots))
    second_slots = protocol.receive(sock)
    assert second_slots is not None, "no reply to the second reserve"
    protocol.send(sock, put_message(second, second_slots["slots"]))
    # The first put's commit is held, and still the second batch's blocks are written.
    keys = [bytes.fromhex(k) for k in hexes(second)]
    assert gate.wait_written(keys), "the second batch waited for the first one's commit"
    gate.open.set()
    assert protocol.receive(sock) == {"ok": True, "stored": 4}
    assert protocol.receive(sock) == {"ok": True, "stored": 4}
    lookup = call(sock, {"op": "lookup", "keys": hexes(first + second)})
    assert lookup["tiers"] == ["nvme"] * 8


def test_the_next_part_of_a_load_is_read_before_the_client_asks_for_it(root, start_sidecar, monkeypatch):
    sidecar = start_sidecar(kvtier_config(root, dram={"capacity_bytes": 0}), block_bytes=BLOCK)
    reads: list[int] = []  # blocks per NVMe read, in order
    done = threading.Condition()
    real_read = NvmeStore.read_unhashed

    def counted(store: NvmeStore, requests: Sequence[tuple[int, memoryview]]) -> list[bool]:
        whole = real_read(store, requests)
        with done:
            reads.append(len(requests))
            done.notify_all()
        return whole

    monkeypatch.setattr(NvmeStore, "read_unhashed", counted)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(WAIT_S)
        conn.connect(str(root / "kv.sock"))
        for first in range(0, 96, 32):
            numbers = list(range(first, first + 32))
            slots = call(conn, {"op": "reserve", "keys": hexes(numbers)})["slots"]
            assert call(conn, put_message(numbers, slots))["stored"] == 32
        first = call(conn, {"op": "get", "keys": hexes(range(96))})["slots"]
        with done:  # no second get was sent, and the second part is read all the same
            assert done.wait_for(lambda: len(reads) == 2, WAIT_S), reads
        second = call(conn, {"op": "get", "keys": hexes(range(48, 96))})["slots"]
        # Answered from the read-ahead: no read of its own. The third part's read-ahead starts
        # once this answer is sent, so it may already be in ``reads`` (all three checked below).
        assert (len(first), len(second), reads[:2]) == (48, 24, [48, 24])
        assert not set(first) & set(second)
        call(conn, {"op": "release", "slots": first + second})
        # The third part was read ahead too; the client asks for something else instead.
        assert call(conn, {"op": "lookup", "keys": hexes([0])})["tiers"] == ["nvme"]
        assert reads == [48, 24, 12]
        call(conn, {"op": "stats"})
        assert sidecar.service.dram is not None and not sidecar.service.dram._leases


def test_a_failing_read_ahead_leaves_the_connection_serving(root, start_sidecar, monkeypatch):
    start_sidecar(kvtier_config(root, dram={"capacity_bytes": 0}), block_bytes=BLOCK)
    reads: list[int] = []
    real_read = NvmeStore.read_unhashed

    def second_read_fails(store: NvmeStore, requests: Sequence[tuple[int, memoryview]]) -> list[bool]:
        reads.append(len(requests))
        if len(reads) == 2:  # the read-ahead's
            raise ValueError("a fault in the read path")
        return real_read(store, requests)

    monkeypatch.setattr(NvmeStore, "read_unhashed", second_read_fails)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(WAIT_S)
        conn.connect(str(root / "kv.sock"))
        slots = call(conn, {"op": "reserve", "keys": hexes(range(64))})["slots"]
        assert call(conn, put_message(range(64), slots))["stored"] == 64
        assert len(call(conn, {"op": "get", "keys": hexes(range(64))})["slots"]) == 32
        assert len(call(conn, {"op": "get", "keys": hexes(range(32, 64))})["slots"]) == 16
        assert reads[:3] == [32, 16, 16]  # read again at the get


def test_a_reserve_waits_for_the_staging_slots_of_a_put_in_flight(root, monkeypatch):
    gate = Gate(monkeypatch)
    service = KVTierService(kvtier_config(root, dram={"capacity_bytes": 0}), staging_slots=4)
    service.configure(BLOCK)
    try:
        owner = Owner()
        pending = service.put_async(owner, reserved(service, owner, [1, 2, 3, 4]))
        assert gate.syncing.wait(WAIT_S) and not pending.done()  # all four staging slots held
        threading.Timer(0.5, gate.open.set).start()  # a reserve that did not wait finds none
        second = reserved(service, owner, [5, 6, 7, 8])
        assert len(second) == 4, second
        assert pending.result(WAIT_S) == 4
    finally:
        gate.open.set()
        service.close()


def test_a_full_tier_makes_room_for_the_blocks_still_in_flight(root, monkeypatch):
    gate = Gate(monkeypatch)
    config = kvtier_config(root, dram={"capacity_bytes": 0}, nvme={"capacity_bytes": 8 * BLOCK})
    service = KVTierService(config, staging_slots=8)
    service.configure(BLOCK)
    try:
        gate.open.set()
        assert save(service, [1, 2, 3, 4]) + save(service, [5, 6, 7, 8]) == 8  # full
        gate.open.clear()
        owner = Owner()
        first = service.put_async(owner, reserved(service, owner, [11, 12, 13, 14]))
        assert gate.syncing.wait(WAIT_S)  # in flight: slots taken, not in the index yet
        second = service.put_async(owner, reserved(service, owner, [15, 16, 17, 18]))
        gate.open.set()
        assert first.result(WAIT_S) + second.result(WAIT_S) == 8
        assert service.lookup([n.to_bytes(16, "big") for n in range(11, 19)]) == ["nvme"] * 8
    finally:
        gate.open.set()
        service.close()


def test_the_index_log_is_compacted_only_when_outgrown_without_listing_every_block(root, monkeypatch):
    assert not log_outgrown(4096, 0) and log_outgrown(4097, 0)
    assert not log_outgrown(4 * 1000 + 4096, 1000) and log_outgrown(4 * 1000 + 4097, 1000)
    listed: list[int] = []
    real_records = NvmeTier.records

    def records(tier: NvmeTier) -> Iterator[Record]:
        listed.append(len(tier.index))
        return real_records(tier)

    monkeypatch.setattr(NvmeTier, "records", records)
    service = KVTierService(kvtier_config(root, dram={"capacity_bytes": 0}), staging_slots=4)
    service.configure(BLOCK)
    try:
        for batch in range(3):
            save(service, [10 * batch + n for n in range(4)])
        assert listed == []  # three commits, no list of the index
        store = service.nvme.store  # type: ignore[union-attr]
        store._log_records = 5000  # as if many evictions had been logged
        save(service, [100 + n for n in range(4)])
        assert listed == [16]  # compacted once, with every live block
        live, _ = decode_log((root / "nvme" / "index.log").read_bytes())
        assert len(live) == 16
    finally:
        service.close()


@pytest.mark.parametrize(
    ("asked", "answers"),
    [(200, [32, 32, 32, 32, 32, 20, 10, 8, 2]), (96, [32, 32, 16, 8, 8]), (40, [20, 10, 8, 2]), (3, [3])],
)
def test_a_load_from_a_lower_tier_ends_with_short_answers(asked, answers):
    got, left = [], asked
    while left:
        got.append(min(left, staging_budget(left, 32)))
        left -= got[-1]
    assert got == answers


def test_the_sidecar_answers_a_long_nvme_load_in_shrinking_parts(root):
    service = KVTierService(kvtier_config(root, dram={"capacity_bytes": 0}), staging_slots=64)
    service.configure(BLOCK)
    try:
        for first in range(0, 96, 8):
            save(service, range(first, first + 8))
        keys, owner, answers = [n.to_bytes(16, "big") for n in range(96)], Owner(), []
        while keys and (found := service.get(owner, keys)):
            answers.append(len(found))
            service.release(owner, [slot for slot, _ in found])
            keys = keys[len(found) :]
        assert answers == [32, 32, 16, 8, 8]  # half the 64 staging slots, then halves of the rest
    finally:
        service.close()


def test_a_write_through_put_writes_its_dram_blocks_down_outside_the_lock(root, monkeypatch):
    """Write-through: the put's DRAM blocks go to NVMe on the committer thread, like staging
    blocks (other requests are served while the disk syncs; the reply still waits for it), and
    a DRAM slot evicted meanwhile is not handed out again until its write is committed."""
    gate = Gate(monkeypatch)
    config = kvtier_config(root, dram={"capacity_bytes": 4 * BLOCK}, write_mode="write-through")
    service = KVTierService(config, staging_slots=4, background_demotion=False)
    service.configure(BLOCK)
    try:
        owner = Owner()
        blocks = reserved(service, owner, [1, 2, 3, 4])
        for n, block in enumerate(blocks, 1):
            assert service.dram is not None
            service.dram.block(block.slot)[:] = n.to_bytes(4, "big") * (BLOCK // 4)
        pending = service.put_async(owner, blocks)
        assert gate.syncing.wait(WAIT_S)  # written, its commit held: the lock is free
        assert service.lookup([b.key for b in blocks]) == ["dram"] * 4
        assert not pending.done()
        # DRAM is full: four new blocks evict the four in flight, whose slots must not return.
        given = service.reserve(Owner(), [n.to_bytes(16, "big") for n in range(5, 9)])
        assert not set(given) & {b.slot for b in blocks}, given
        gate.open.set()
        assert pending.result(WAIT_S) == 4
        assert service.nvme is not None and all(b.key in service.nvme.index for b in blocks)
        assert service.dram is not None and not service.dram._leases
    finally:
        gate.open.set()
        service.close()
