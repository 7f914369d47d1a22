"""The DRAM tier survives a sidecar restart: the slot table beside the shared-memory file
(record encoding, recovery order, layout checks), the service re-entering recorded blocks
after a restart (verified, oldest first, torn ones dropped and counted), and a real sidecar
process killed with SIGKILL after DRAM-only write-back saves."""

from __future__ import annotations

import errno
import logging
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from strata.worker.kv_connector import BlockRef
from strata.worker.kvtier import recovery, slottable
from strata.worker.kvtier.client import SidecarUnavailable, TierClient
from strata.worker.kvtier.service import KVTierService
from strata.worker.kvtier.slottable import Layout, SlotRecord, SlotTable

from .conftest import kvtier_config, worker_config
from .test_crash import SHAPE, block_data, spawn
from .test_service import BLOCK, get, key, make, payload, put

NO_LOWER: dict[str, Any] = {"nvme": {"capacity_bytes": 0}}  # DRAM only: write-back has nowhere to demote to


# ---- the table, pure ----


def test_record_round_trips_and_torn_or_cleared_records_are_not_valid():
    data = slottable.encode_record(key(1), key(0), 2**64 - 5, 42)
    assert len(data) == slottable.RECORD_BYTES
    assert slottable.decode_record(7, data) == SlotRecord(7, key(1), key(0), 2**64 - 5, 42)
    for i in range(slottable.CHECKED_BYTES):  # the body or its crc changed (torn): not valid
        torn = bytearray(data)
        torn[i] ^= 0x40
        assert slottable.decode_record(7, bytes(torn)) is None, f"byte {i}"
    later = data[: slottable.SEQ_OFFSET] + (43).to_bytes(8, "little")  # a use renews it alone
    assert slottable.decode_record(7, later) == SlotRecord(7, key(1), key(0), 2**64 - 5, 43)
    assert slottable.decode_record(7, bytes(slottable.RECORD_BYTES)) is None  # cleared
    state_only = bytearray(slottable.RECORD_BYTES)  # a new record's first byte alone landed
    state_only[0] = slottable.VALID
    assert slottable.decode_record(7, bytes(state_only)) is None


def test_header_mismatch_says_what_changed():
    layout = Layout(block_bytes=4096, slot_bytes=4096, slots=64, arena_inode=9)
    assert slottable.decode_header(slottable.encode_header(layout)) == layout
    assert slottable.mismatch(layout, layout) is None
    assert slottable.mismatch(None, layout) == "no slot table of this format"
    assert slottable.decode_header(b"STRKVDT0" + bytes(56)) is None  # another format
    smaller = Layout(2048, 4096, 64, 9)
    assert slottable.mismatch(smaller, layout) == "block_bytes changed: 2048 -> 4096"
    assert slottable.mismatch(Layout(4096, 4096, 32, 9), layout) == "slots changed: 32 -> 64"
    assert slottable.mismatch(Layout(4096, 4096, 64, 8), layout) == "arena_inode changed: 8 -> 9"


def test_recovery_order_is_oldest_first_and_keeps_a_keys_newest_record():
    records = [
        SlotRecord(0, key(1), key(0), 11, seq=5),
        SlotRecord(1, key(2), key(1), 12, seq=2),
        SlotRecord(2, key(1), key(0), 13, seq=9),  # key 1 again, later: the one kept
        SlotRecord(3, key(3), key(2), 14, seq=7),
    ]
    kept, dropped = slottable.recovery_order(records)
    assert [(r.slot, r.seq) for r in kept] == [(1, 2), (3, 7), (2, 9)]
    assert [r.slot for r in dropped] == [0]
    # Each parent that is recovered too is its record's own key object, not an equal copy
    # (49 bytes a block in the DRAM index the recovery pass builds from them).
    assert kept[0].parent is kept[2].key and kept[1].parent is kept[0].key
    assert kept[2].parent == key(0)  # not recovered: as recorded


def test_table_keeps_records_across_opens_only_under_the_same_layout(tmp_path):
    path = tmp_path / "kv.slots"
    layout = Layout(4096, 4096, 8, 1)
    table = SlotTable(path, layout)
    assert table.mismatch == "no slot table of this format"
    table.commit(3, key(3), key(2), 33)
    table.commit(5, key(5), key(4), 55)
    table.commit(6, key(6), key(5), 66)
    table.clear(5)
    table.close()

    again = SlotTable(path, layout)
    assert again.mismatch is None
    assert sorted((r.slot, r.key, r.checksum, r.seq) for r in again.records()) == [
        (3, key(3), 33, 1),
        (6, key(6), 66, 3),
    ]
    again.commit(0, key(9), key(8), 99)  # numbered after what was found
    again.touch(3)  # used: the most recent now
    again.touch(5)  # a slot without a record stays without one
    assert sorted((r.slot, r.seq) for r in again.records()) == [(0, 4), (3, 5), (6, 3)]
    again.close()

    other = SlotTable(path, Layout(4096, 4096, 16, 1))
    assert other.mismatch == "slots changed: 8 -> 16"
    assert other.records() == []
    other.close()


# ---- the service: a restart in the same process ----


def restart(service: KVTierService, root: Path, **overrides: Any) -> KVTierService:
    assert service.wait_sealed(10)
    service.close()
    return make(root, **overrides)


def wait_recovered(service: KVTierService) -> dict[str, Any]:
    """Until the background pass has verified every recorded block; its stats."""
    assert service.wait_recovered(60)
    stats = service.stats()["recovery"]
    assert isinstance(stats, dict)
    return stats


def test_write_back_dram_blocks_survive_a_restart_bit_exact(root):
    service = make(root, **NO_LOWER)
    assert put(service, list(range(6))) == 6
    again = restart(service, root, **NO_LOWER)
    stats = wait_recovered(again)
    assert stats == {
        "state": "done",
        "reason": None,
        "found": 6,
        "recovered": 6,
        "corrupt": 0,
        "dropped": 0,
        "pending": 0,
    }
    assert again.lookup([key(n) for n in range(6)]) == ["dram"] * 6
    assert get(again, list(range(6))) == [payload(n) for n in range(6)]
    assert again.metrics.recovered_blocks.labels("dram")._value.get() == 6
    again.close()


def test_a_block_asked_for_before_the_pass_reaches_it_is_verified_at_once(root, monkeypatch):
    service = make(root, **NO_LOWER)
    put(service, list(range(4)))
    monkeypatch.setattr(recovery.Recovery, "_step", lambda self: False)  # the pass never runs
    again = restart(service, root, **NO_LOWER)
    assert again.stats()["recovery"]["pending"] == 4  # type: ignore[index]
    assert again.lookup([key(0), key(1)]) == ["dram", "dram"]
    assert get(again, [2]) == [payload(2)]
    stats = again.stats()["recovery"]
    assert stats["recovered"] == 3 and stats["pending"] == 1  # type: ignore[index]
    again.close()


def test_a_block_overwritten_while_the_sidecar_was_down_is_dropped_and_counted(root):
    service = make(root, **NO_LOWER)
    put(service, list(range(4)))
    assert service.dram is not None
    slot = service.dram.index.get(key(2)).slot  # type: ignore[union-attr]
    again_path = root / "shm" / "kv"
    service.wait_sealed(10)
    service.close()
    with open(again_path, "r+b") as shm:  # half the block overwritten, its record left as it was
        shm.seek(slot * BLOCK + BLOCK // 2)
        shm.write(os.urandom(BLOCK // 2))

    again = make(root, **NO_LOWER)
    stats = wait_recovered(again)
    assert (stats["recovered"], stats["corrupt"]) == (3, 1)
    assert again.lookup([key(n) for n in range(4)]) == ["dram", "dram"]  # stops at the torn one
    assert get(again, [2]) == []
    assert get(again, [3]) == [payload(3)]
    assert again.metrics.corrupt_blocks.labels("dram")._value.get() == 1
    again.close()


def test_evicted_blocks_are_not_resurrected_by_a_restart(root):
    """Capacity 2: blocks 0 and 1 were evicted and their slots reused by 2 and 3 (their records
    cleared first); after the restart only 2 and 3 are there, intact."""
    small: dict[str, Any] = {**NO_LOWER, "dram": {"capacity_bytes": 2 * BLOCK}}
    service = make(root, **small)
    put(service, list(range(4)))
    again = restart(service, root, **small)
    stats = wait_recovered(again)
    assert (stats["found"], stats["recovered"], stats["corrupt"]) == (2, 2, 0)
    assert again.lookup([key(0)]) == [] and again.lookup([key(1)]) == []
    assert get(again, [2, 3]) == [payload(2), payload(3)]
    again.close()


def test_a_slot_reused_before_its_new_block_was_sealed_has_no_record(root, monkeypatch):
    """The old block's record is cleared before its slot is handed out again, so a restart
    before the new block's checksum is taken finds nothing there (not a stale record whose
    checksum the new bytes fail)."""
    small: dict[str, Any] = {**NO_LOWER, "dram": {"capacity_bytes": 2 * BLOCK}}
    service = make(root, **small)
    put(service, [0, 1])
    assert service.wait_sealed(10) and service.state.sealer is not None
    monkeypatch.setattr(service.state.sealer, "add", lambda keys: None)  # killed before sealing
    put(service, [2, 3])
    service.close()
    again = make(root, **small)
    stats = wait_recovered(again)
    assert (stats["found"], stats["recovered"], stats["corrupt"]) == (0, 0, 0)
    assert again.lookup([key(n) for n in range(4)]) == []
    again.close()


def test_a_block_promoted_from_nvme_is_recorded_too(root):
    """Read back up into DRAM (and checked there): a restart finds it in DRAM, not only on NVMe."""
    small: dict[str, Any] = {"dram": {"capacity_bytes": 2 * BLOCK}}
    service = make(root, **small)
    put(service, list(range(4)))  # 0 and 1 demoted to NVMe
    assert service.lookup([key(0)]) == ["nvme"]
    assert get(service, [0]) == [payload(0)]  # promoted into a DRAM slot
    again = restart(service, root, **small)
    wait_recovered(again)
    assert again.lookup([key(0)]) == ["dram"]
    assert get(again, [0]) == [payload(0)]
    again.close()


def test_dram_persistent_is_validated_like_the_other_fields():
    assert kvtier_config(Path("/tmp/x")).dram.persistent is True  # the default
    with pytest.raises(ValueError, match="persistent"):
        kvtier_config(Path("/tmp/x"), dram={"persistent": "sometimes"})


@pytest.mark.parametrize("used", [None, 0])
def test_recovered_blocks_keep_their_order_for_eviction(root, used):
    """Saved 0, 1, 2, 3 (and then one of them read): after the restart the least recently saved
    or used block is the first to go."""
    lru: dict[str, Any] = {**NO_LOWER, "dram": {"capacity_bytes": 4 * BLOCK, "eviction": "lru"}}
    service = make(root, **lru)
    for n in range(4):
        put(service, [n])
        assert service.wait_sealed(10)  # sealed (and recorded) in save order
    if used is not None:
        assert get(service, [used]) == [payload(used)]
    order = [n for n in range(4) if n != used] + ([used] if used is not None else [])
    again = restart(service, root, **lru)
    wait_recovered(again)
    put(again, [4])  # needs a slot: the least recently saved or used block goes
    assert again.lookup([key(order[0])]) == []
    assert [again.lookup([key(n)]) for n in [*order[1:], 4]] == [["dram"]] * 4
    again.close()


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"block": 2 * BLOCK}, "block_bytes changed: 4096 -> 8192"),
        ({"dram": {"capacity_bytes": 8 * BLOCK}}, "slots changed: 1024 -> 8"),
    ],
)
def test_a_changed_layout_starts_empty_and_says_why(root, change, reason, caplog):
    service = make(root, **NO_LOWER)
    put(service, list(range(4)))
    assert service.wait_sealed(10)
    service.close()
    block = change.get("block", BLOCK)
    overrides = {**NO_LOWER, **{k: v for k, v in change.items() if k != "block"}}
    again = KVTierService(kvtier_config(root, **overrides), staging_slots=4, background_demotion=False)
    caplog.clear()  # the first start's records too, where an earlier test left INFO on
    with caplog.at_level(logging.INFO, logger="strata.worker.kvtier.recovery"):
        again.configure(block)
    said = [r for r in caplog.records if getattr(r, "event", None) == "dram_recovery"]
    assert [(r.state, r.reason, r.levelname) for r in said] == [("empty", reason, "WARNING")]
    stats = again.stats()["recovery"]
    assert stats["state"] == "empty" and stats["reason"] == reason  # type: ignore[index]
    assert again.lookup([key(0)]) == []
    assert again.stats()["tiers"]["dram"]["blocks"] == 0  # type: ignore[index]
    again.close()


def test_persistent_off_starts_empty_and_leaves_no_table(root):
    service = make(root, **NO_LOWER)
    put(service, list(range(4)))
    again = restart(service, root, nvme={"capacity_bytes": 0}, dram={"persistent": False})
    assert again.lookup([key(0)]) == []
    assert again.stats()["recovery"]["state"] == "off"  # type: ignore[index]
    assert not slottable.table_path(root / "shm" / "kv").exists()
    again.close()


def test_no_room_for_the_table_serves_without_it_and_says_so(root, monkeypatch, caplog):
    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)  # a full memory-backed volume
    service = make(root, **NO_LOWER)
    assert put(service, list(range(3))) == 3  # the DRAM tier serves all the same
    assert get(service, list(range(3))) == [payload(n) for n in range(3)]
    recovery = service.stats()["recovery"]
    assert recovery["state"] == "off" and "no room for the slot table" in recovery["reason"]  # type: ignore[index]
    assert not slottable.table_path(root / "shm" / "kv").exists()
    assert any(
        getattr(r, "event", None) == "dram_recovery" and r.levelname == "WARNING" for r in caplog.records
    )
    service.close()


# ---- a real sidecar process killed with SIGKILL ----


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:  # pragma: no cover - only when shutdown hangs
        proc.kill()
        pytest.fail("sidecar did not stop on SIGTERM")


def slot_of(shm_path: Path, wanted: bytes) -> int:
    """The DRAM slot the table records for ``wanted`` (read while the sidecar is down)."""
    data = slottable.table_path(shm_path).read_bytes()
    for slot in range((len(data) - slottable.HEADER_BYTES) // slottable.RECORD_BYTES):
        offset = slottable.HEADER_BYTES + slot * slottable.RECORD_BYTES
        record = slottable.decode_record(slot, data[offset : offset + slottable.RECORD_BYTES])
        if record is not None and record.key == wanted:
            return slot
    raise AssertionError(f"no record for {wanted.hex()}")


def test_sigkill_after_dram_only_write_back_saves_keeps_the_blocks(root):
    config = worker_config(root, write_mode="write-back", dram={"capacity_bytes": 4 * 2**20}, **NO_LOWER)
    config_path = root / "worker.yaml"
    config_path.write_text(config.to_yaml())
    sock = Path(config.kvtier.socket_path)
    shm_path = Path(config.kvtier.dram.shm_path)
    proc = spawn(config_path, sock)
    client = TierClient(str(sock), SHAPE, torch.float32)
    refs = [BlockRef(key(n), key(n - 1) if n else b"\0" * 16, n) for n in range(24)]
    assert client.save_checked(refs, [block_data(n) for n in range(24)]) == 24
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    client.close()
    torn = slot_of(shm_path, key(20))
    block_bytes = 4 * 2 * 16 * 2 * 64 * 4
    with open(shm_path, "r+b") as shm:  # a stray write into one block while the sidecar was down
        shm.seek(torn * block_bytes + 100)
        shm.write(b"\xa5" * 64)

    proc = spawn(config_path, sock)
    fresh = TierClient(str(sock), SHAPE, torch.float32)
    try:
        out = [torch.empty(SHAPE) for _ in range(20)]
        assert fresh.load([key(n) for n in range(20)], out) == 20
        for n in range(20):
            assert torch.equal(out[n], block_data(n)), f"block {n} differs"
        assert fresh.load([key(20)], [torch.empty(SHAPE)]) == 0  # never served
        rest = [torch.empty(SHAPE) for _ in range(3)]
        assert fresh.load([key(n) for n in range(21, 24)], rest) == 3
        assert all(torch.equal(rest[i], block_data(21 + i)) for i in range(3))
        stats = fresh.stats()
        assert stats is not None
        assert stats["recovery"]["found"] == 24 and stats["recovery"]["corrupt"] == 1
    finally:
        fresh.close()  # first: a sidecar stopping serves its open connections a while
        stop(proc)


BIG = (4, 2, 16, 8, 256)  # 1 MiB float32 blocks: the copy into a reused slot takes a while
POOL = [torch.randn(BIG, generator=torch.Generator().manual_seed(i)) for i in range(24)]


def big(n: int) -> torch.Tensor:
    """Block ``n``'s data: 24 patterns, so a slot reused two batches on gets other bytes."""
    return POOL[n % len(POOL)]


def save_until_killed(sock: Path, proc: subprocess.Popen[bytes], first: int, delay_s: float) -> int:
    """Save 8-block batches from ``first`` on and SIGKILL the sidecar ``delay_s`` after the
    tenth was acknowledged, while later saves go on; the next unsaved block number."""
    acknowledged = threading.Event()
    reached = [first]

    def writer() -> None:
        client = TierClient(str(sock), BIG, torch.float32)
        n = first
        try:
            while n < first + 4000:
                refs = [BlockRef(key(i), key(i - 1) if i else b"\0" * 16, i) for i in range(n, n + 8)]
                if client.save_checked(refs, [big(i) for i in range(n, n + 8)]) and n >= first + 80:
                    acknowledged.set()
                n += 8
                reached[0] = n
        except (SidecarUnavailable, OSError):
            pass
        finally:
            acknowledged.set()

    thread = threading.Thread(target=writer)
    thread.start()
    acknowledged.wait(120)
    time.sleep(delay_s)  # an arbitrary instant of the saves that follow
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    thread.join(timeout=30)
    assert reached[0] > first + 80, "the writer stopped before the kill"
    return reached[0] + 8


@pytest.mark.parametrize("delay_s", [0.0, 0.004])
def test_sigkill_in_the_middle_of_dram_saves_never_leaves_a_stale_record(root, delay_s):
    """16 DRAM slots, saves going on (each batch evicting the batch two back, its slots reused
    while the client copies into them): killed at an arbitrary instant, the restarted sidecar
    finds no record whose slot holds other bytes (none fails its checksum), and serves what it
    found bit-exact."""
    config = worker_config(root, write_mode="write-back", dram={"capacity_bytes": 16 * 2**20}, **NO_LOWER)
    config_path = root / "worker.yaml"
    config_path.write_text(config.to_yaml())
    sock = Path(config.kvtier.socket_path)
    end = save_until_killed(sock, spawn(config_path, sock), 0, delay_s)
    proc = spawn(config_path, sock)
    fresh = TierClient(str(sock), BIG, torch.float32)
    try:
        held = [n for n in range(end) if fresh.lookup([key(n)]) == ["dram"]]
        stats = fresh.stats()
        assert stats is not None
        recovery = stats["recovery"]
        assert recovery["corrupt"] == 0, recovery
        assert recovery["recovered"] == len(held) > 0, (recovery, held)
        for n in held:
            out = [torch.empty(BIG)]
            assert fresh.load([key(n)], out) == 1
            assert torch.equal(out[0], big(n)), f"block {n} differs"
    finally:
        fresh.close()  # first: a sidecar stopping serves its open connections a while
        stop(proc)
