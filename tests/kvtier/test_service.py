"""The block service's policies, driven directly (no socket): promotion and demotion, NVMe
admission, write-through, pins, retention, full disks, warm restarts and metrics."""

from __future__ import annotations

import errno
import os
import socket
import threading
import time
import urllib.request
from typing import Any

import pytest

from strata.stack.wait import wait_for
from strata.worker.block_events import parse_line
from strata.worker.kvtier.arena import checksum
from strata.worker.kvtier.janitor import Janitor
from strata.worker.kvtier.nvme import NvmeStore
from strata.worker.kvtier.recovery import Recovery
from strata.worker.kvtier.server import Sidecar
from strata.worker.kvtier.service import KVTierService, Owner, PutBlock
from strata.worker.kvtier.shared import FilesystemBlockStore
from strata.worker.kvtier.walls import tenant_root

from .conftest import MiB, kvtier_config

BLOCK = 4096
ROOT = b"\xff" * 16  # the chain's root: not a block key


def key(n: int) -> bytes:
    return n.to_bytes(16, "big")


def payload(n: int) -> bytes:
    return n.to_bytes(4, "big") * (BLOCK // 4)


def put(service: KVTierService, numbers: list[int], batch: int = 2) -> int:
    """Commit blocks ``batch`` at a time (as the client does, within the staging area)."""
    return sum(_put(service, numbers[i : i + batch]) for i in range(0, len(numbers), batch))


def _put(service: KVTierService, numbers: list[int]) -> int:
    owner = Owner()
    slots = service.reserve(owner, [key(n) for n in numbers])
    blocks = []
    for n, slot in zip(numbers, slots, strict=True):
        if slot is not None:
            assert service.dram is not None
            service.dram.block(slot)[:] = payload(n)
            blocks.append(PutBlock(key(n), key(n - 1) if n else ROOT, slot))
    return service.put(owner, blocks)


def get(service: KVTierService, numbers: list[int], batch: int = 2) -> list[bytes]:
    """Read blocks ``batch`` at a time, as the client does; stops at the first miss."""
    data: list[bytes] = []
    for i in range(0, len(numbers), batch):
        got = _get(service, numbers[i : i + batch])
        data += got
        if len(got) < len(numbers[i : i + batch]):
            break
    return data


def _get(service: KVTierService, numbers: list[int]) -> list[bytes]:
    owner = Owner()
    found = service.get(owner, [key(n) for n in numbers])
    assert service.dram is not None
    data = [bytes(service.dram.block(slot)) for slot, _ in found]
    service.release(owner, [slot for slot, _ in found])
    return data


def make(root, background_demotion: bool = False, **overrides) -> KVTierService:
    """A service with 4 staging slots; demotion only when room is needed unless asked."""
    config = kvtier_config(root, **overrides)
    service = KVTierService(config, staging_slots=4, background_demotion=background_demotion)
    service.configure(BLOCK)
    return service


def test_background_demoter_writes_victims_down_off_the_save_path(root, monkeypatch):
    writing, disk_free = threading.Event(), threading.Event()
    real_write = NvmeStore.write

    def slow_disk(store: NvmeStore, batch: Any) -> Any:
        writing.set()
        assert disk_free.wait(120), "test never freed the disk"
        return real_write(store, batch)

    monkeypatch.setattr(NvmeStore, "write", slow_disk)
    service = make(root, background_demotion=True, dram={"capacity_bytes": 16 * BLOCK, "eviction": "lru"})
    try:
        put(service, list(range(14)))  # 2 free slots, under the reserve of 4: the demoter wakes
        assert writing.wait(120)  # ... and is stuck writing the oldest blocks to a slow disk
        assert put(service, [100]) == 1  # a save still finds a free slot at once
        assert service.lookup([key(0), key(100)]) == ["dram", "dram"]  # demoting: still served
        assert get(service, [0]) == [payload(0)]
        disk_free.set()
        deadline = time.monotonic() + 120
        while service.lookup([key(0)]) != ["nvme"]:
            assert time.monotonic() < deadline, "the demotion never committed"
            time.sleep(0.05)
        assert get(service, [0, 1]) == [payload(0), payload(1)]
    finally:
        disk_free.set()
        service.close()


def test_write_back_demotes_dram_victims_to_nvme_and_promotes_on_get(root):
    service = make(root, dram={"capacity_bytes": 4 * BLOCK})
    put(service, list(range(10)))
    found = service.lookup([key(n) for n in range(10)])
    assert len(found) == 10 and found.count("dram") == 4, found
    assert service.metrics.demotions.labels("nvme")._value.get() == 6
    assert get(service, list(range(10))) == [payload(n) for n in range(10)]
    assert service.metrics.promotions.labels("dram")._value.get() >= 4
    service.close()


def test_write_through_writes_a_block_down_once_a_read_admits_it(root):
    service = make(root, write_mode="write-through", nvme={"admit_after_hits": 1})
    put(service, [0, 1])
    assert service.nvme is not None and key(0) not in service.nvme.index  # seen once: not admitted
    assert get(service, [0, 1]) == [payload(0), payload(1)]  # seen twice: admitted
    service.wait_for_hints()  # wait for the background write-down
    assert key(0) in service.nvme.index and key(1) in service.nvme.index
    service.close()


def test_nvme_admits_only_blocks_seen_more_than_admit_after_hits(root):
    service = make(root, dram={"capacity_bytes": 2 * BLOCK}, nvme={"admit_after_hits": 1})
    put(service, [0, 1])
    get(service, [0])  # block 0 seen twice
    put(service, [2, 3])  # evicts 0 and 1 from DRAM
    assert service.lookup([key(0)]) == ["nvme"]
    assert service.lookup([key(1)]) == []
    service.close()


def test_write_through_stores_every_tier_at_once(root):
    service = make(root, write_mode="write-through", shared={"enabled": True})
    put(service, [0, 1])
    assert service.nvme is not None and service.shared is not None
    assert key(0) in service.nvme.index and key(1) in service.shared.index
    service.close()


def test_a_blocks_parent_in_the_same_put_is_its_key_object_in_every_tier(root):
    """One key object per block however many entries name it (49 bytes a block in millions)."""
    service = make(root, write_mode="write-through", shared={"enabled": True})
    put(service, [0, 1, 2, 3], batch=4)
    for tier in (service.dram, service.nvme, service.shared):
        assert tier is not None
        held = {k: k for k in tier.index}
        for n in (1, 2, 3):
            entry = tier.index.get(key(n))
            assert entry is not None and entry.parent == key(n - 1)
            assert entry.parent is held[key(n - 1)]
    service.close()


def test_the_shared_volumes_janitor_keeps_every_workers_blocks_within_its_size(root):
    """Another replica filled the shared volume past its size before this sidecar started: the
    sidecar takes the janitor's lock, sweeps, and reports it; its own writes go on."""
    other = FilesystemBlockStore(tenant_root(root / "shared", ""))  # the tenant's directory
    for n in range(100, 140):  # 40 blocks of a volume sized for 16 (16 MiB / 1 MiB files)
        other.write(key(n), ROOT, 0, memoryview(payload(n) * 256))
    service = make(root, write_mode="write-through", shared={"enabled": True})
    try:

        def report() -> dict[str, Any] | None:
            janitor = service.stats()["shared_janitor"]
            assert isinstance(janitor, dict)
            return janitor if janitor["last_sweep"] else None

        janitor = wait_for(report, 60, "the janitor's first sweep")
        assert janitor["holding"]
        sweep = janitor["last_sweep"]
        assert sweep["files"] == 40 and sweep["left_bytes"] <= 0.9 * 16 * MiB
        assert service.metrics.volume_bytes.labels("shared")._value.get() == sweep["left_bytes"]
        assert service.metrics.janitor_removed.labels("shared")._value.get() == sweep["removed_lru"] > 0
        put(service, [0, 1])
        assert service.shared is not None and key(1) in service.shared.index
    finally:
        service.close()
    successor = Janitor(root / "shared", 1)
    assert successor.take_lock()  # closed, the sidecar left the lock to the next janitor
    successor.stop()


def test_a_block_another_replica_wrote_to_the_shared_volume_is_not_written_again(root):
    first = make(
        root / "a", write_mode="write-through", shared={"enabled": True, "path": str(root / "shared")}
    )
    second = make(
        root / "b", write_mode="write-through", shared={"enabled": True, "path": str(root / "shared")}
    )
    try:
        put(first, [0, 1])
        written = os.stat(FilesystemBlockStore(tenant_root(root / "shared", ""))._path(key(0)))
        put(second, [0, 1, 2])  # the same prefix, computed again, and one block more
        again = os.stat(FilesystemBlockStore(tenant_root(root / "shared", ""))._path(key(0)))
        assert (again.st_ino, again.st_mtime_ns) == (written.st_ino, written.st_mtime_ns)
        assert second.metrics.written_bytes.labels("shared")._value.get() == BLOCK  # block 2 alone
        assert second.shared is not None and list(second.shared.index) == [key(2)]
    finally:
        first.close()
        second.close()


def test_dram_disabled_goes_straight_to_lower_tiers_through_staging(root):
    service = make(root, dram={"capacity_bytes": 0})
    assert put(service, [0, 1, 2]) == 3
    assert service.lookup([key(0), key(1), key(2)]) == ["nvme"] * 3
    assert get(service, [0, 1, 2]) == [payload(n) for n in range(3)]
    service.close()


def test_pinned_blocks_stay_in_dram(root):
    service = make(root, dram={"capacity_bytes": 3 * BLOCK})
    service.pin([key(0), key(1)])
    put(service, list(range(8)))
    assert service.lookup([key(0), key(1)]) == ["dram", "dram"]
    service.close()


def test_prefetch_promotes_to_dram(root):
    service = make(root, dram={"capacity_bytes": 4 * BLOCK})
    put(service, list(range(8)))
    service.prefetch([key(0), key(1)])
    service.wait_for_hints()  # wait for the hint to be acted on
    assert service.dram is not None and key(0) in service.dram.index and key(1) in service.dram.index
    # The first lookup credits the tier the prefetch found them in, so hit metrics stay honest;
    # from then on they are DRAM blocks like any other.
    assert service.lookup([key(0), key(1)]) == ["nvme", "nvme"]
    assert service.lookup([key(0), key(1)]) == ["dram", "dram"]
    said = service.metrics.render().decode()
    assert 'strata_kvtier_prefetched_total{tier="nvme"} 2.0' in said
    assert 'strata_kvtier_prefetch_used_total{tier="nvme"} 2.0' in said  # once each, not twice
    service.close()


def test_prefetch_reads_nvme_runs_in_parallel_reads_of_an_answers_size(root, nvme_reads):
    """A prefetch reads a chain's NVMe blocks a run at a time (one parallel read each, at most
    ``answer_blocks``: 2 with 4 staging slots), not a block at a time; it skips what DRAM
    holds and gives every promoted block its parent in the chain."""
    service = make(root, dram={"capacity_bytes": 8 * BLOCK})
    put(service, list(range(16)))  # the first ones demoted to NVMe as the later ones came in
    assert service.dram is not None and service.nvme is not None
    on_nvme = [n for n in range(16) if key(n) in service.nvme.index and key(n) not in service.dram.index]
    assert on_nvme[:5] == [0, 1, 2, 3, 4]
    get(service, [0, 1, 2])  # blocks 0-2 up to DRAM again: the prefetch below goes past them
    del nvme_reads[:]  # the reads of the get above
    service.prefetch([key(n) for n in range(8)])
    service.wait_for_hints()  # wait for the hint to be acted on
    assert nvme_reads and max(nvme_reads) == 2
    assert sum(nvme_reads) == len([n for n in on_nvme if 3 <= n < 8])
    assert service.answer_blocks == 2
    assert all(key(n) in service.dram.index for n in range(3, 8))
    third, sixth = service.dram.index.get(key(3)), service.dram.index.get(key(6))
    assert third is not None and third.parent == key(2)
    assert sixth is not None and sixth.parent == key(5)
    service.close()


def test_retention_drops_unused_blocks(root):
    service = make(root, retention_s=60.0, write_mode="write-through")
    put(service, [0, 1])
    assert service.sweep(now=time.time() + 30) == 0
    assert service.sweep(now=time.time() + 120) == 4  # two in DRAM, two in NVMe
    assert service.lookup([key(0)]) == []
    service.close()


def test_full_disk_refuses_blocks_and_keeps_serving(root, monkeypatch):
    service = make(root, dram={"capacity_bytes": 2 * BLOCK})

    def no_space(fd, buffers, offset):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwritev", no_space)
    put(service, list(range(6)))  # demotions fail: the blocks are dropped, nothing raises
    assert service.lookup([key(4), key(5)]) == ["dram", "dram"]
    assert service.lookup([key(0)]) == []
    assert service.metrics.errors.labels("nvme")._value.get() >= 1
    assert service.metrics.full.labels("nvme")._value.get() == 1
    monkeypatch.undo()  # the disk has room again
    assert service.nvme is not None and not service.nvme.admits_writes(time.monotonic())
    put(service, [10, 11, 12])  # no admissions until the tier tries again
    assert service.lookup([key(4)]) == []
    service.nvme.full_until = 0.0  # the retry time has passed
    put(service, [20, 21, 22])
    assert service.lookup([key(10)]) == ["nvme"] or service.lookup([key(11)]) == ["nvme"]
    assert service.metrics.full.labels("nvme")._value.get() == 0
    service.close()


def test_a_restart_on_a_full_volume_keeps_its_blocks_and_does_not_crash(root, monkeypatch):
    service = make(root, dram={"capacity_bytes": 2 * BLOCK})
    put(service, list(range(6)))
    held = set(service.nvme.index) if service.nvme is not None else set()
    service.close()
    real_open = open

    def full(path, mode="r", *args, **kwargs):  # the log's rewrite finds no room
        if str(path).endswith(".tmp") and "w" in mode:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr("builtins.open", full)
    again = make(root, dram={"capacity_bytes": 2 * BLOCK})
    assert again.nvme is not None and set(again.nvme.index) == held and held
    again.close()


def test_warm_restart_serves_nvme_blocks_and_drops_torn_ones(root):
    service = make(root, dram={"capacity_bytes": 2 * BLOCK})
    put(service, list(range(8)))
    tear(service, root, 3)

    again = make(root, dram={"capacity_bytes": 2 * BLOCK})
    # Until the recovery pass admits DRAM's two recorded blocks, their slots are held, so reads
    # pass through staging slots and are left to the reading client to check (verify_reads);
    # this test's reader does not check. Admitted, they make way and reads land in DRAM slots.
    assert again.wait_recovered(60)
    assert again.nvme is not None
    recovered = {k: k for k in again.nvme.index}
    entry = again.nvme.index.get(key(5))
    assert entry is not None and entry.parent is recovered[key(4)]  # the parent's own key object
    assert_torn_block_dropped(again)
    again.close()


def test_torn_nvme_block_is_caught_while_recovery_holds_dram(root, monkeypatch):
    """A restart whose DRAM recovery pass has not run yet (a busy machine): every DRAM slot is
    held, so the reads pass through staging slots; with clients that do not check their reads,
    the service checks them, and the torn block is still never served."""
    dram = {"capacity_bytes": 2 * BLOCK, "verify_reads": False}
    service = make(root, dram=dram)
    put(service, list(range(8)))
    assert service.wait_sealed(60)  # blocks 6 and 7 recorded in DRAM's slot table
    tear(service, root, 3)
    monkeypatch.setattr(Recovery, "_step", lambda self: False)  # the pass never gets a turn

    again = make(root, dram=dram)
    assert_torn_block_dropped(again)
    assert again.stats()["recovery"]["pending"] == 2  # type: ignore[index]
    again.close()


def tear(service: KVTierService, root, number: int) -> None:
    """Close ``service``, then overwrite half of block ``number`` on its NVMe file, unrecorded."""
    assert service.nvme is not None
    torn_slot = service.nvme.index.get(key(number)).slot  # type: ignore[union-attr]
    service.close()
    with open(root / "nvme" / "blocks.dat", "r+b") as data:
        data.seek(torn_slot * BLOCK + BLOCK // 2)
        data.write(os.urandom(BLOCK // 2))


def assert_torn_block_dropped(service: KVTierService) -> None:
    """After :func:`tear` of block 3 of eight: 0-5 listed on NVMe, 0-2 served intact, 3 never."""
    assert service.lookup([key(n) for n in range(6)]) == ["nvme"] * 6
    assert get(service, [0, 1, 2]) == [payload(n) for n in range(3)]
    assert get(service, [3, 4]) == []  # the torn block is never served ...
    assert service.lookup([key(3)]) == []  # ... and is gone from the index
    assert service.metrics.corrupt_blocks.labels("nvme")._value.get() == 1


def test_a_block_another_replica_wrote_costs_this_workers_share_nothing(root):
    """This worker's share of the shared tier is full: blocks another replica wrote already
    are not written again, and evict none of this worker's own."""
    shared = {"enabled": True, "path": str(root / "shared")}
    first = make(root / "a", write_mode="write-through", shared=shared)
    second = make(root / "b", write_mode="write-through", shared={**shared, "capacity_bytes": 2 * BLOCK})
    try:
        put(first, [0, 1])
        put(second, [5, 6])  # its whole share
        put(second, [0, 1])
        assert second.shared is not None and set(second.shared.index) == {key(5), key(6)}
        assert second.metrics.evictions.labels("shared")._value.get() == 0
        assert FilesystemBlockStore(tenant_root(root / "shared", "")).contains(key(5))
    finally:
        first.close()
        second.close()


def test_unreachable_shared_tier_degrades_to_lower_tiers(root):
    blocker = root / "blocker"
    blocker.write_text("")
    service = make(
        root,
        dram={"capacity_bytes": 2 * BLOCK},
        nvme={"capacity_bytes": 0},
        shared={"enabled": True, "path": str(blocker / "shared")},
    )
    put(service, list(range(4)))  # demotions to the shared tier fail quietly
    assert service.lookup([key(2), key(3)]) == ["dram", "dram"]
    assert service.lookup([key(0)]) == []
    assert service.shared is not None and not service.shared.healthy
    service.close()


def test_a_shared_tier_failing_a_read_is_a_miss_and_is_skipped_from_then_on(root, monkeypatch):
    service = make(
        root,
        dram={"capacity_bytes": 2 * BLOCK},
        nvme={"capacity_bytes": 0},
        shared={"enabled": True},
    )
    try:
        put(service, list(range(4)))  # the first two demoted to the shared tier
        assert service.lookup([key(0)]) == ["shared"]

        def failing(*args: object) -> int:
            raise OSError(errno.EIO, "Input/output error")

        assert service.shared is not None
        monkeypatch.setattr(service.shared.store, "read_checked", failing)
        assert get(service, [0]) == []
        assert not service.shared.healthy and service.lookup([key(0)]) == []
    finally:
        service.close()


def test_put_into_a_slot_not_reserved_is_refused(root):
    service = make(root)
    with pytest.raises(ValueError, match="slot 0 is not reserved"):
        service.put(Owner(), [PutBlock(key(0), ROOT, 0)])
    service.close()


def test_dropped_connection_returns_its_slots(root):
    service = make(root, dram={"capacity_bytes": 2 * BLOCK})
    owner = Owner()
    assert None not in service.reserve(owner, [key(0), key(1)])
    service.drop_owner(owner)
    assert service.dram is not None and service.dram.free_slots() == 2
    service.close()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_metrics_and_health_endpoints(root):
    port = free_port()
    sidecar = Sidecar(kvtier_config(root), block_bytes=BLOCK, metrics_port=port)
    sidecar.start()
    try:
        put(sidecar.service, [0, 1])
        sidecar.service.lookup([key(0), key(9)])
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert 'strata_kvtier_hits_total{tier="dram"} 1.0' in body
        assert 'strata_kvtier_used_bytes{tier="dram"} 8192.0' in body
        assert "strata_kvtier_write_seconds_bucket" in body
        assert urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5).status == 200
    finally:
        sidecar.stop()


def test_admission_decisions_and_the_rule_in_force_are_metrics(root):
    """What a tier's admission let in and kept out, and whether it follows the doorkeeper (an
    adaptive policy's choice is otherwise invisible)."""
    small = {"capacity_bytes": 2 * BLOCK}
    door = make(root / "a", dram={**small, "admission": "doorkeeper"}, nvme={"capacity_bytes": 0})
    adaptive = make(root / "b", dram={**small, "admission": "adaptive"}, nvme={"capacity_bytes": 0})
    try:
        for service in (door, adaptive):
            put(service, [10, 11])  # room for both: admitted whatever the rule
            put(service, [0, 1])  # first sightings in a full tier: the doorkeeper refuses both
            put(service, [0, 1])  # second: it lets them in
        said = door.metrics.render().decode()
        assert 'strata_kvtier_refused_total{tier="dram"} 2.0' in said
        assert 'strata_kvtier_admitted_total{tier="dram"} 4.0' in said
        assert 'strata_kvtier_admission_doorkeeper{tier="dram"} 1.0' in said
        said = adaptive.metrics.render().decode()  # starts as always: nothing refused
        assert 'strata_kvtier_admitted_total{tier="dram"} 4.0' in said
        assert 'strata_kvtier_refused_total{tier="dram"} 0.0' in said
        assert 'strata_kvtier_admission_doorkeeper{tier="dram"} 0.0' in said
    finally:
        door.close()
        adaptive.close()


@pytest.mark.parametrize("eviction", ["lru", "prefix-aware"])
def test_promotion_when_dram_and_nvme_are_both_full(root, eviction):
    # Promoting NVMe blocks needs DRAM room; the DRAM victims' demotion needs NVMe room, which
    # must not be taken from the very blocks being promoted.
    service = make(
        root,
        dram={"capacity_bytes": 2 * BLOCK, "eviction": eviction},
        nvme={"capacity_bytes": 4 * BLOCK, "eviction": eviction},
    )
    put(service, list(range(6)))
    dram, nvme = service.dram, service.nvme
    assert dram is not None and nvme is not None and len(nvme.index) == 4
    for batch in (1, 2, 4, 1, 3):
        for start in range(6):
            owner = Owner()
            found = service.get(owner, [key(n) for n in range(start, 6)][:batch])
            for n, (slot, _) in zip(range(start, 6), found, strict=False):
                assert bytes(dram.block(slot)) == payload(n)
            service.release(owner, [slot for slot, _ in found])
        assert len(nvme.index) <= 4 and len(dram.index) <= 2
    service.close()


@pytest.mark.parametrize("verify", [True, False])
def test_dram_reads_carry_the_checksum_once_sealed_unless_verification_is_off(root, verify):
    service = make(root, dram={"capacity_bytes": 8 * BLOCK, "verify_reads": verify})
    put(service, [0, 1])
    assert service.wait_sealed(60)
    owner = Owner()
    found = service.get(owner, [key(0), key(1)])
    service.release(owner, [slot for slot, _ in found])
    expected = [checksum(payload(0)), checksum(payload(1))] if verify else [None, None]
    assert [crc for _, crc in found] == expected
    service.close()


def test_block_events_stream_each_tiers_holdings_and_changes(root):
    """GET /kv/events: the snapshot of what every tier holds (NVMe recovered from its log too),
    then the changes as blocks move, and pings; the stream ends when the sidecar stops."""
    port = free_port()
    config = kvtier_config(root, write_mode="write-through")
    sidecar = Sidecar(config, block_bytes=BLOCK, metrics_port=port)
    sidecar.start()
    try:
        put(sidecar.service, [0, 1])
        stream = urllib.request.urlopen(f"http://127.0.0.1:{port}/kv/events", timeout=10)
        events = [parse_line(stream.readline()) for _ in range(3)]
        held = {e.tier: set(e.blocks) for e in events if e.kind == "snapshot"}
        assert held == {"dram": {key(0), key(1)}, "nvme": {key(0), key(1)}}
        assert events[-1].kind == "synced"
        put(sidecar.service, [2])
        changes: set[tuple[str, str, bytes]] = set()
        kinds: set[str] = set()
        deadline = time.monotonic() + 30
        while not {("stored", "dram", key(2)), ("stored", "nvme", key(2))} <= changes or "ping" not in kinds:
            assert time.monotonic() < deadline, (changes, kinds)
            event = parse_line(stream.readline())
            kinds.add(event.kind)
            changes |= {(event.kind, event.tier, b) for b in event.blocks}
    finally:
        sidecar.stop()
    rest = stream.read()  # returns: the stream ended with the sidecar
    assert all(parse_line(line) for line in rest.splitlines())
