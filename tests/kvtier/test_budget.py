"""The sidecar fits its tiers' indexes within its memory: the shared tier gives way first, then
NVMe, then DRAM; the limit comes from the config or the container's cgroup. The staging slots
take what the operator gives them, the DRAM tier's slots what the memory-backed volume holds, and
indexes that never expire keep no recency list; the look-ahead's announced blocks are bounded."""

from __future__ import annotations

import dataclasses
import logging
import os
from types import SimpleNamespace

import pytest

from strata.common import kvbudget as budget
from strata.common.kvbudget import INDEX_BYTES_PER_BLOCK as PER_BLOCK
from strata.common.kvbudget import (
    KVTIER_STAGING_BYTES,
    LEAST_STAGING_SLOTS,
    Blocks,
    fit,
    fixed_bytes,
    slot_bytes_for,
    staging_slots_for,
)
from strata.common.sketchsize import footprint, sightings_table_bytes
from strata.worker import cgroup
from strata.worker.cgroup import memory_limit
from strata.worker.kvtier import leases as leases_module
from strata.worker.kvtier.index import Entry, TierIndex
from strata.worker.kvtier.service import KVTierService, Owner
from strata.worker.kvtier.shm import shm_room
from strata.worker.kvtier.sightings import SHM_LEAVE_FREE

from .conftest import MiB, kvtier_config

SLOT = 4096
ASKED = Blocks(dram=100, nvme=1000, shared=5000)


def test_without_a_limit_every_tier_keeps_its_size():
    fitted = fit(ASKED, None, fixed=10 * MiB, slot_bytes=SLOT)
    assert fitted.fitted == ASKED and not fitted.clipped


def test_a_limit_with_room_for_everything_clips_nothing():
    need = 100 * (SLOT + PER_BLOCK) + 6000 * PER_BLOCK
    assert fit(ASKED, MiB + need, fixed=MiB, slot_bytes=SLOT).fitted == ASKED


@pytest.mark.parametrize(
    ("room", "expected"),
    [
        (6000 - 1, Blocks(100, 1000, 4999)),  # the shared tier gives way first
        (1000, Blocks(100, 1000, 0)),
        (400, Blocks(100, 400, 0)),  # then NVMe
        (0, Blocks(100, 0, 0)),
    ],
)
def test_the_shared_tier_gives_way_first_then_nvme(room, expected):
    limit = MiB + 100 * (SLOT + PER_BLOCK) + room * PER_BLOCK
    fitted = fit(ASKED, limit, fixed=MiB, slot_bytes=SLOT)
    assert fitted.fitted == expected and fitted.clipped
    assert fitted.report()["fitted"] == dataclasses.asdict(expected)


def test_dram_gives_way_last_and_nothing_goes_negative():
    limit = MiB + 40 * (SLOT + PER_BLOCK) + PER_BLOCK // 2
    assert fit(ASKED, limit, fixed=MiB, slot_bytes=SLOT).fitted == Blocks(40, 0, 0)
    assert fit(ASKED, MiB // 2, fixed=MiB, slot_bytes=SLOT).fitted == Blocks(0, 0, 0)


def test_the_fixed_part_counts_the_admission_policies_sketches_and_shadows(root):
    asked = Blocks(dram=64_000, nvme=512_000, shared=0)
    plain = kvtier_config(root, dram={"admission": "always"}, nvme={"admission": "always"})
    learning = kvtier_config(root, dram={"admission": "adaptive"}, nvme={"admission": "doorkeeper"})
    sightings = sightings_table_bytes(asked.nvme)  # nvme.admit_after_hits' counts
    dram_table, shadow_keys = footprint("adaptive", asked.dram)
    nvme_table, _ = footprint("doorkeeper", asked.nvme)
    assert shadow_keys and dram_table < nvme_table
    lookaheads = 2 * budget.MAX_EXPECTED_BLOCKS * budget.EXPECTED_BYTES_PER_BLOCK  # engine's, routers'
    base = budget.BASE_BYTES + 8 * SLOT + lookaheads
    # each table in memory and in its file, the largest twice more (a save's copies), the
    # shadow tiers' keys
    assert fixed_bytes(plain, asked, SLOT, staging_slots=8) == base + 4 * sightings
    tables = dram_table + nvme_table + sightings
    learnt = 2 * tables + 2 * max(nvme_table, sightings) + shadow_keys * PER_BLOCK
    assert fixed_bytes(learning, asked, SLOT, staging_slots=8) == base + learnt


@pytest.mark.parametrize(
    ("text", "limit"),
    [("max\n", None), ("9223372036854771712\n", None), ("2147483648\n", 2 << 30), ("garbage", None)],
)
def test_the_limit_is_read_from_the_containers_cgroup(tmp_path, monkeypatch, text, limit):
    v2, v1 = tmp_path / "memory.max", tmp_path / "memory.limit_in_bytes"
    monkeypatch.setattr(cgroup, "CGROUP_LIMITS", (v2, v1))
    assert memory_limit(None) is None  # neither file: no container limit known
    v1.write_text("1073741824\n")
    assert memory_limit(None) == 1 << 30  # cgroup v1
    v2.write_text(text)
    assert memory_limit(None) == (limit if text != "garbage" else 1 << 30)
    assert memory_limit(5 * MiB) == 5 * MiB  # the config's wins


def test_a_sidecar_with_little_memory_indexes_fewer_lower_tier_blocks_and_says_so(root, caplog):
    shared = {"enabled": True, "capacity_bytes": 64 * MiB}
    unfitted = KVTierService(kvtier_config(root / "a", shared=shared), staging_slots=4)
    unfitted.configure(SLOT)
    asked = unfitted.memory
    assert asked is not None and not asked.clipped and asked.fitted.shared == 64 * MiB // SLOT
    unfitted.close()
    nvme_blocks = asked.asked.nvme
    limit = asked.fixed + asked.asked.dram * (SLOT + PER_BLOCK) + (nvme_blocks + 100) * PER_BLOCK
    config = kvtier_config(root / "b", shared=shared, memory_bytes=limit)
    service = KVTierService(config, staging_slots=4)
    with caplog.at_level(logging.WARNING, logger="strata.worker.kvtier.assembly"):
        service.configure(SLOT)
    try:
        assert service.nvme is not None and service.shared is not None
        assert service.nvme.index.capacity == nvme_blocks and service.shared.index.capacity == 100
        memory = service.stats()["memory"]
        assert isinstance(memory, dict) and memory["limit_bytes"] == limit
        assert memory["fitted"]["shared"] == 100 and memory["asked"]["shared"] == 64 * MiB // SLOT
        assert service.metrics.capacity_bytes.labels("shared")._value.get() == 100 * SLOT
        assert service.metrics.configured_bytes.labels("shared")._value.get() == 64 * MiB  # the alert's
        (said,) = [r for r in caplog.records if getattr(r, "event", None) == "memory_fit"]
        assert "fitted within" in said.getMessage() and "spec.model.kvBytesPerToken" in said.getMessage()
    finally:
        service.close()


@pytest.mark.parametrize(("block_mib", "slots"), [(0.1875, 96), (2, 96), (5, 51), (10, 25), (40, 12)])
def test_staging_slots_fit_the_bytes_the_operator_gives_them(block_mib, slots):
    slot_bytes = slot_bytes_for(int(block_mib * MiB))
    assert staging_slots_for(slot_bytes) == slots
    assert slots * slot_bytes <= KVTIER_STAGING_BYTES or slots == LEAST_STAGING_SLOTS


def test_a_sidecar_sizes_its_staging_slots_by_the_engines_blocks(root):
    service = KVTierService(kvtier_config(root, dram={"capacity_bytes": 64 * MiB}))
    try:
        reply = service.configure(5 * MiB)
        assert reply["max_batch"] == service.staging_slots == 51
        assert reply["num_slots"] == 64 * MiB // service.slot_bytes + 51
    finally:
        service.close()


def test_indexes_that_never_expire_keep_no_recency_list():
    index = TierIndex(10, "prefix-aware", expires=False)
    index.add(b"a", Entry(parent=None, priority=0, pinned=False, last_used=0.0))
    index.touch(b"a", 5.0)
    index.pin(b"a")
    assert index.remove(b"a").last_used == 5.0
    with pytest.raises(RuntimeError, match="without expiry"):
        index.expired(100.0, 1.0)


def test_dram_slots_fit_the_memory_backed_volume_with_their_table_records():
    shm = 40 * (SLOT + budget.TABLE_BYTES_PER_SLOT) + 10
    fitted = fit(ASKED, None, fixed=MiB, slot_bytes=SLOT, shm=shm)
    assert fitted.fitted == Blocks(40, 1000, 5000) and fitted.report()["shm_room_bytes"] == shm
    assert fit(ASKED, None, fixed=MiB, slot_bytes=SLOT, shm=-5).fitted.dram == 0
    # a DRAM tier the volume cuts short leaves the memory to the lower tiers' indexes
    limit = MiB + 100 * (SLOT + PER_BLOCK) + 6000 * PER_BLOCK - 1
    assert fit(ASKED, limit, fixed=MiB, slot_bytes=SLOT, shm=shm).fitted == Blocks(40, 1000, 5000)


def _volume(monkeypatch, free: int) -> None:
    pages = -(-free // 4096)  # whole pages, never less than ``free``
    monkeypatch.setattr(os, "statvfs", lambda path: SimpleNamespace(f_bavail=pages, f_frsize=4096))


def test_the_volumes_room_is_what_is_free_and_what_the_arena_holds_less_staging(root, monkeypatch):
    arena = root / "shm" / "kv"  # its directory does not exist yet: the volume above it is read
    _volume(monkeypatch, 200 * MiB)
    assert shm_room(arena, staging_bytes=8 * MiB) == 192 * MiB - SHM_LEAVE_FREE
    arena.parent.mkdir()
    arena.write_bytes(b"x" * MiB)  # a restart finds its slots' pages in use: they are ours
    held = os.stat(arena).st_blocks * 512
    assert shm_room(arena, staging_bytes=8 * MiB) == 192 * MiB + held - SHM_LEAVE_FREE
    with pytest.raises(ValueError, match=r"dram.shm_path: .* staging slots alone need .*--shm-size"):
        shm_room(arena, staging_bytes=400 * MiB)


def test_a_sidecar_on_a_small_dev_shm_serves_a_smaller_dram_tier_instead_of_a_sigbus(root, monkeypatch):
    _volume(monkeypatch, SHM_LEAVE_FREE + 4 * SLOT + 100 * (SLOT + budget.TABLE_BYTES_PER_SLOT))
    service = KVTierService(kvtier_config(root), staging_slots=4)  # DRAM asks for 1,024 slots
    try:
        service.configure(SLOT)
        assert service.dram is not None and service.dram.capacity == 100
        assert service.dram.arena.num_slots == 104
        memory = service.stats()["memory"]
        assert isinstance(memory, dict) and memory["fitted"]["dram"] == 100
    finally:
        service.close()
    _volume(monkeypatch, 2 * SLOT)
    too_small = KVTierService(kvtier_config(root / "b"), staging_slots=4)
    with pytest.raises(ValueError, match="staging slots alone"):
        too_small.configure(SLOT)
    too_small.close()


def test_announced_requests_past_the_lookaheads_blocks_are_not_announced(root, monkeypatch):
    """The look-ahead's memory is bounded in blocks: a request that would take the connection's
    announced blocks past ``MAX_EXPECTED_BLOCKS`` is refused, the nearer ones keep theirs, and
    what a scheduled request frees is announced again."""
    monkeypatch.setattr(leases_module, "MAX_EXPECTED_BLOCKS", 10)
    service = KVTierService(kvtier_config(root), staging_slots=4)
    service.configure(SLOT)
    owner = Owner()
    try:
        service.expect(owner, "a", [bytes([1, n]) * 8 for n in range(6)])
        service.expect(owner, "b", [bytes([2, n]) * 8 for n in range(6)])  # 12 > 10: refused
        assert list(owner.expected) == ["a"] and owner.expected_blocks == 6
        assert service.stats()["lookahead_refused"] == 1
        assert service.dram is not None and service.dram.index.is_expected(bytes([1, 0]) * 8)
        assert not service.dram.index.is_expected(bytes([2, 0]) * 8)
        service.unexpect(owner, ["a"])  # scheduled
        service.expect(owner, "b", [bytes([2, n]) * 8 for n in range(6)])
        assert list(owner.expected) == ["b"] and owner.expected_blocks == 6
        service.drop_owner(owner)
        assert owner.expected_blocks == 0 and not service.dram.index.is_expected(bytes([2, 0]) * 8)
    finally:
        service.close()
