"""The shared volume's janitor: what it removes (pure), on a real directory written by two
workers' stores, one janitor at a time, and a full volume that does not stop reads."""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

from strata.stack.wait import wait_for
from strata.worker.kvtier import janitor
from strata.worker.kvtier.index import Entry
from strata.worker.kvtier.janitor import Found, Janitor, Tally, boundary, bucket, cutoff, is_stale, scan
from strata.worker.kvtier.shared import FilesystemBlockStore
from strata.worker.kvtier.tiers import SharedTier

BLOCK = 4096
NO_PARENT = b"\0" * 16


def key(n: int) -> bytes:
    return n.to_bytes(16, "big")


def block(name: str, mtime: float, size: int = 100) -> Found:
    return Found(Path(name), size, mtime, temporary=False)


def victims(found: list[Found], capacity: int) -> list[Found]:
    """What a sweep removes from ``found``, its two passes run over a list."""
    tally = Tally()
    for f in found:
        tally.add(f)
    cut = cutoff(tally, capacity)
    if cut is None:
        return []
    blocks = [f for f in found if not f.temporary]
    older = sorted((f for f in blocks if bucket(f.mtime) < cut.bucket), key=lambda f: f.mtime)
    return older + boundary([f for f in blocks if bucket(f.mtime) == cut.bucket], cut.excess)


def test_nothing_goes_while_the_volume_is_under_its_high_watermark():
    found = [block(f"b{i}", 1000.0 + i) for i in range(95)]
    assert victims(found, capacity=10_000) == []


def test_above_it_the_least_recently_used_go_down_to_the_low_watermark():
    found = [block(f"b{i}", 1000.0 + i) for i in range(100)]  # 10,000 bytes of 10,000
    assert [v.path.name for v in victims(found, capacity=10_000)] == [f"b{i}" for i in range(10)]
    # over several minutes: the older minutes go whole, the last one in part
    found = [block(f"b{i}", 1000.0 + 30 * i) for i in range(100)]
    assert [v.path.name for v in victims(found, capacity=10_000)] == [f"b{i}" for i in range(10)]


def test_within_one_second_a_chains_tail_goes_before_its_head():
    head, tail = block("head", 1000.1), block("tail", 1000.7)  # read head first, as chains are
    newer = [block(f"n{i}", 2000.0 + i) for i in range(18)]
    removed = victims([head, tail, *newer], capacity=2000)  # 2,000 bytes: 100 too many
    assert [v.path.name for v in removed][:2] == ["tail", "head"]
    assert [v.path.name for v in boundary([head, tail], 150)] == ["tail", "head"]
    assert [v.path.name for v in boundary([head, tail], 100)] == ["tail"]


def test_temporary_files_go_once_their_writer_is_surely_gone():
    old = Found(Path(".x.tmp"), 50, 1000.0, temporary=True)
    fresh = Found(Path(".y.tmp"), 50, 1000.0 + janitor.STALE_TMP_S, temporary=True)
    now = 1000.0 + janitor.STALE_TMP_S + 1
    assert is_stale(old, now) and not is_stale(fresh, now) and not is_stale(block("b", 0.0), now)
    assert (
        victims([fresh, *(block(f"b{i}", 1000.0 + i) for i in range(99))], capacity=10_000)[0].path.name
        == "b0"
    )


def write(store: FilesystemBlockStore, numbers: range, mtime: float) -> None:
    for n in numbers:
        store.write(key(n), NO_PARENT, 0, memoryview(bytes([n % 256]) * BLOCK))
        os.utime(store._path(key(n)), (mtime + n, mtime + n))


def test_a_sweep_keeps_two_workers_blocks_within_the_size_and_the_recently_read(tmp_path):
    a, b = FilesystemBlockStore(tmp_path), FilesystemBlockStore(tmp_path)  # two replicas
    write(a, range(0, 20), mtime=time.time() - 3600)
    write(b, range(20, 40), mtime=time.time() - 1800)
    out = memoryview(bytearray(BLOCK))
    assert b.read_into(key(0), out)  # a's oldest block, read just now: recently used
    file_bytes = os.path.getsize(a._path(key(0)))
    capacity = 20 * file_bytes  # the volume holds 40 blocks: twice its size
    (tmp_path / "00" / ".dead.tmp").write_bytes(b"x")  # a writer killed mid-write, long ago
    os.utime(tmp_path / "00" / ".dead.tmp", (time.time() - 3600, time.time() - 3600))

    sweep = Janitor(tmp_path, capacity).sweep()

    left = {f.path.name for f in scan(tmp_path)}
    assert sweep.left_bytes <= janitor.LOW_WATERMARK * capacity
    assert sweep.removed_stale == 1 and ".dead.tmp" not in left
    assert sweep.removed_lru == 40 - len(left)
    assert a._path(key(0)).name in left  # read recently: kept
    assert a._path(key(1)).name not in left  # a's other old blocks went first
    assert all(b._path(key(n)).name in left for n in range(30, 40))  # the newest stay


def test_a_sweep_holds_only_the_files_of_the_minute_where_removal_stops(tmp_path, monkeypatch):
    """Blocks last used over 40 minutes, a tenth too many: the oldest minutes go as the second
    pass meets them; only one minute's files are ever held and ordered."""
    store = FilesystemBlockStore(tmp_path)
    start = time.time() - 7200
    for n in range(40):
        store.write(key(n), NO_PARENT, 0, memoryview(bytes([n]) * BLOCK))
        os.utime(store._path(key(n)), (start + 60 * n, start + 60 * n))  # one block a minute
    file_bytes = os.path.getsize(store._path(key(0)))
    held: list[int] = []

    def counted(found: list[Found], excess: int) -> list[Found]:
        held.append(len(found))
        return boundary(found, excess)

    monkeypatch.setattr(janitor, "boundary", counted)
    sweep = Janitor(tmp_path, capacity=36 * file_bytes).sweep()  # 40 of 36: over 95%
    assert held == [1]  # the minute where removal stops, alone
    assert sweep.removed_lru == 40 - 32 and sweep.left_bytes == 32 * file_bytes  # down to 90%
    assert {f.path.name for f in scan(tmp_path)} == {store._path(key(n)).name for n in range(8, 40)}


def test_one_janitor_at_a_time_and_the_next_takes_over(tmp_path):
    first, second = Janitor(tmp_path, 1), Janitor(tmp_path, 1)
    assert first.take_lock() and first.holding
    assert not second.take_lock()
    first.stop()  # its sidecar stopped (or died): the lock is free
    assert second.take_lock()
    second.stop()


def test_a_running_janitor_sweeps_when_a_write_finds_the_volume_full(tmp_path):
    store = FilesystemBlockStore(tmp_path)
    write(store, range(10), mtime=time.time() - 60)
    sweeps: list[janitor.Sweep] = []
    keeper = Janitor(tmp_path, 5 * os.path.getsize(store._path(key(0))), sweeps.append, every_s=3600)
    keeper.start()
    try:
        wait_for(lambda: sweeps, 60, "the janitor's first sweep, at its start", interval_s=0.05)
        assert len(sweeps) == 1 and sweeps[0].removed_lru == 6  # down to 4 of 5 blocks' room
        write(store, range(10, 13), mtime=time.time())
        tier = SharedTier(store, 100, on_full=keeper.full)
        tier.write_failed(OSError(errno.ENOSPC, "No space left on device"))
        wait_for(lambda: len(sweeps) == 2, 60, "a sweep now, not an hour later", interval_s=0.05)
        assert sweeps[1].removed_lru == 3
    finally:
        keeper.stop()


def test_a_full_volume_drops_writes_but_keeps_serving_reads(tmp_path):
    store = FilesystemBlockStore(tmp_path)
    write(store, range(1), mtime=time.time())
    calls: list[int] = []
    tier = SharedTier(store, 10, on_full=lambda: calls.append(1))
    tier.write_failed(OSError(errno.ENOSPC, "No space left on device"))
    assert tier.healthy and calls == [1]
    assert tier.store.read_into(key(0), memoryview(bytearray(BLOCK)))  # the volume still reads
    tier.write_failed(OSError(errno.EIO, "Input/output error"))  # a failing volume: skip it a while
    assert not tier.healthy


def test_a_block_removed_under_a_reader_on_nfs_is_a_miss(tmp_path, monkeypatch):
    store = FilesystemBlockStore(tmp_path)
    write(store, range(1), mtime=time.time())

    def stale_handle(*args: object, **kwargs: object) -> object:
        raise OSError(errno.ESTALE, "Stale file handle")

    monkeypatch.setattr("builtins.open", stale_handle)
    assert store.read_into(key(0), memoryview(bytearray(BLOCK))) is False


def test_a_block_the_janitor_removed_leaves_its_writers_index_so_it_can_be_written_again(tmp_path):
    store = FilesystemBlockStore(tmp_path)
    tier = SharedTier(store, 10)
    write(store, range(1), mtime=time.time())
    tier.index.add(key(0), Entry(NO_PARENT, 0, False, time.time()))
    store._path(key(0)).unlink()  # the janitor's sweep
    assert not tier.contains(key(0))
    assert key(0) not in tier.index


def test_between_full_scans_the_file_systems_usage_says_whether_to_scan(tmp_path, monkeypatch):
    keeper = Janitor(tmp_path, capacity=1000)
    used = {"bytes": 0}
    monkeypatch.setattr(janitor, "filesystem_used", lambda root: used["bytes"])
    now = time.monotonic()
    assert keeper.needs_scan(now)  # never scanned: a first full scan
    keeper.sweep()
    assert not keeper.needs_scan(now)  # 0 bytes used: no file can be over the watermark
    used["bytes"] = 951  # over 95% of 1,000
    assert keeper.needs_scan(now)
    used["bytes"] = 0
    assert keeper.needs_scan(now + janitor.FULL_SCAN_EVERY_S + 1)  # a full scan now and then anyway
    keeper.full()  # a write found the volume full
    assert keeper.needs_scan(now)


def test_a_file_another_worker_removed_meanwhile_is_skipped_even_on_nfs(tmp_path, monkeypatch):
    def stale(self: Path, missing_ok: bool = False) -> None:
        raise OSError(errno.ESTALE, "Stale file handle")

    monkeypatch.setattr(Path, "unlink", stale)
    assert janitor.remove([block("gone", 1.0)]) == 0  # no error: nothing left to remove
