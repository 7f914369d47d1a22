"""The NVMe and shared stores on their own: bit-exact I/O, the index log's recovery rules,
full disks and damaged files."""

from __future__ import annotations

import errno
import mmap
import os

import pytest

from strata.worker.kvtier.arena import checksum
from strata.worker.kvtier.nvme import RECORD_BYTES, LogReplay, NvmeStore, Record, decode_log, encode
from strata.worker.kvtier.shared import CorruptBlock, FilesystemBlockStore
from strata.worker.kvtier.tiers import SharedTier

SLOT = 4096


def record(n: int, slot: int, data: bytes) -> Record:
    return Record(n.to_bytes(16, "big"), b"\0" * 16, slot, 0, checksum(data))


def open_store(path, slots: int = 8) -> NvmeStore:
    return NvmeStore(path, SLOT, SLOT, slots, io_threads=2)


def test_nvme_round_trip_and_warm_recovery(root):
    store = open_store(root)
    assert store.recover(persistent=True) == {}
    blocks = [os.urandom(SLOT) for _ in range(3)]
    store.write([(record(n, n, b), memoryview(b)) for n, b in enumerate(blocks)])
    store.close()

    again = open_store(root)
    live = again.recover(persistent=True)
    assert sorted(r.slot for r in live.values()) == [0, 1, 2]
    for n, data in enumerate(blocks):
        out = memoryview(bytearray(SLOT))
        assert again.read([(live[n.to_bytes(16, "big")].slot, out)]) == [checksum(data)]
        assert bytes(out) == data
    again.close()


def test_not_persistent_starts_empty(root):
    store = open_store(root)
    store.recover(persistent=True)
    data = os.urandom(SLOT)
    store.write([(record(1, 0, data), memoryview(data))])
    store.close()
    again = open_store(root)
    assert again.recover(persistent=False) == {}
    again.close()


def test_log_replay_cuts_a_torn_tail_and_applies_deletes_and_slot_reuse():
    data = b"x" * SLOT
    log = encode(1, record(1, 0, data)) + encode(1, record(2, 1, data)) + encode(2, record(1, 0, b""))
    log += encode(1, record(3, 1, data))  # slot 1 reused: block 2 is gone
    live, intact = decode_log(log + encode(1, record(4, 2, data))[:-5])
    assert set(live) == {(3).to_bytes(16, "big")}
    assert intact == 4 * RECORD_BYTES


def test_log_replay_stops_at_a_corrupt_record():
    data = b"x" * SLOT
    bad = bytearray(encode(1, record(2, 1, data)))
    bad[3] ^= 1
    live, _ = decode_log(encode(1, record(1, 0, data)) + bytes(bad) + encode(1, record(3, 2, data)))
    assert set(live) == {(1).to_bytes(16, "big")}


@pytest.mark.parametrize("piece", [1, 40, RECORD_BYTES, 3 * RECORD_BYTES + 7])
def test_log_replay_fed_in_pieces_equals_the_whole(piece):
    """Pieces of any length, a record split between two of them included."""
    data = b"x" * SLOT
    log = b"".join(encode(1, record(n, n % 5, data)) for n in range(12)) + encode(2, record(11, 1, b""))
    log += encode(1, record(20, 0, data))[:-1]  # the log ends within a record: not counted
    whole, intact = decode_log(log)
    replay = LogReplay()
    for start in range(0, len(log), piece):
        replay.feed(log[start : start + piece])
    assert replay.finish() == whole and list(replay.live) == list(whole)
    assert replay.intact == intact == 13 * RECORD_BYTES
    assert sorted(int.from_bytes(k, "big") for k in whole) == [7, 8, 9, 10]


def test_log_replay_applies_nothing_after_a_damaged_record():
    data = b"x" * SLOT
    bad = bytearray(encode(1, record(2, 1, data)))
    bad[3] ^= 1
    replay = LogReplay()
    replay.feed(encode(1, record(1, 0, data)) + bytes(bad)[:10])
    replay.feed(bytes(bad)[10:])
    replay.feed(encode(1, record(3, 2, data)))
    assert set(replay.finish()) == {(1).to_bytes(16, "big")} and replay.intact == RECORD_BYTES


def test_log_replay_gives_each_parent_its_parents_own_key_object():
    """A batch's child may be logged before its parent: the parent is still its key object
    once the log is read (an equal copy would be 49 bytes more a block in the index)."""
    data = b"x" * SLOT
    child = Record((2).to_bytes(16, "big"), (1).to_bytes(16, "big"), 1, 0, 0)
    live, _ = decode_log(encode(1, child) + encode(1, record(1, 0, data)))
    assert live[child.key].parent is live[(1).to_bytes(16, "big")].key


def test_layout_change_discards_old_blocks(root):
    store = open_store(root)
    store.recover(persistent=True)
    data = os.urandom(SLOT)
    store.write([(record(1, 0, data), memoryview(data))])
    store.close()
    other = NvmeStore(root, 2 * SLOT, 2 * SLOT, 4, io_threads=1)
    assert other.recover(persistent=True) == {}
    other.close()


def test_full_disk_at_start_gives_a_smaller_tier(root, monkeypatch):
    real = os.posix_fallocate

    def fallocate(fd: int, offset: int, length: int) -> None:
        if length > 2 * SLOT:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd, offset, length)

    monkeypatch.setattr(os, "posix_fallocate", fallocate)
    store = open_store(root, slots=8)
    assert store.num_slots == 2
    store.close()


def test_shared_round_trip_and_corruption(root):
    store = FilesystemBlockStore(root / "shared")
    key, data = b"k" * 16, os.urandom(10_000)
    assert not store.contains(key)
    store.write(key, b"p" * 16, 0, memoryview(data))
    out = memoryview(bytearray(len(data)))
    assert store.read_into(key, out) and bytes(out) == data
    assert store.read_checked(key, out) == checksum(memoryview(data))  # what the read verified
    path = next((root / "shared").rglob("*.kv"))
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(CorruptBlock):
        store.read_into(key, out)
    assert not store.contains(key)  # deleted, never served again
    assert not store.read_into(b"z" * 16, out)
    assert store.read_checked(b"z" * 16, out) is None


def test_shared_truncated_file_is_corrupt(root):
    store = FilesystemBlockStore(root)
    key, data = b"k" * 16, os.urandom(5000)
    store.write(key, b"p" * 16, 0, memoryview(data))
    path = next(root.rglob("*.kv"))
    path.write_bytes(path.read_bytes()[:-100])  # a torn copy left by some other writer
    with pytest.raises(CorruptBlock):
        store.read_into(key, memoryview(bytearray(5000)))


def test_unreachable_shared_tier_degrades_to_misses(root):
    blocker = root / "not-a-dir"
    blocker.write_text("a file where the volume should be")
    tier = SharedTier(FilesystemBlockStore(blocker / "shared"), capacity=4)
    key = b"k" * 16
    out = memoryview(bytearray(16))
    with pytest.raises(OSError):
        tier.store.write(key, key, 0, memoryview(b"x" * 16))
    with pytest.raises(OSError):  # the promotion that reads it marks the tier down (test_service)
        tier.store.read_checked(key, out)
    tier.mark_down(OSError("gone"))
    assert not tier.healthy and not tier.contains(key)


def test_page_aligned_slots_move_by_direct_io_bit_exact(root):
    store = open_store(root)
    store.recover(persistent=False)
    slot = memoryview(mmap.mmap(-1, SLOT))  # page-aligned, like the sidecar's slots
    slot[:] = os.urandom(SLOT)
    assert store._direct_fd is not None and store._fd_for(slot) == store._direct_fd
    assert store._fd_for(memoryview(bytearray(100))) != store._direct_fd  # unaligned: page cache
    store.write([(record(1, 3, bytes(slot)), slot)])
    back = memoryview(mmap.mmap(-1, SLOT))
    assert store.read([(3, back)]) == [checksum(slot)]
    assert bytes(back) == bytes(slot)
    store.close()
