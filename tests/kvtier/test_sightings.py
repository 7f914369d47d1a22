"""What the admission policies learnt survives a sidecar restart: the sketch's export and
restore, the file's format and the checks that make a changed or damaged one start fresh, the
service saving and restoring it, and the replayed trace showing why it matters."""

from __future__ import annotations

import errno
import hashlib
import logging
import shutil
import threading
from typing import Any

import pytest

from strata.stack.wait import wait_for
from strata.worker.kvtier import admission, sightings, simulate
from strata.worker.kvtier.admission import Adaptive, Doorkeeper, FrequencySketch, Learnt, SightingCounts
from strata.worker.kvtier.service import Owner

from .conftest import TRACES
from .test_service import BLOCK, make, put


def key(n: int) -> bytes:
    """A block hash as the engine makes them: the sketch hashes a key's first 8 bytes, which
    test_service's small-integer keys leave all zero."""
    return hashlib.blake2b(n.to_bytes(8, "big"), digest_size=16).digest()


DOORKEEPER: dict[str, Any] = {"dram": {"admission": "doorkeeper"}, "nvme": {"capacity_bytes": 0}}


# ---- pure: the sketch and the file ----


def test_sketch_export_restores_every_estimate_and_refuses_another_size():
    sketch = FrequencySketch(64)
    for n in [1, 2, 2, 3, 3, 3, *range(100, 150)]:
        sketch.increment(n)
    table, added = sketch.export()
    copy = FrequencySketch(64)
    copy.restore(table, added)
    assert [copy.estimate(n) for n in range(200)] == [sketch.estimate(n) for n in range(200)]
    assert copy.export() == (table, added)
    with pytest.raises(ValueError, match="counters"):
        FrequencySketch(4096).restore(table, added)


def test_adaptive_keeps_its_gate_and_score_not_its_shadows():
    learnt_by = Adaptive(4096, "prefix-aware")
    for n in range(50):
        learnt_by.admits(n, None)
    learnt_by.score = 7.5
    fresh = Adaptive(4096, "prefix-aware")
    fresh.restore(learnt_by.learnt())
    assert fresh.score == 7.5 and fresh.using_doorkeeper
    assert fresh.gate.sketch.export() == learnt_by.gate.sketch.export()
    assert not fresh.always.keys  # the shadows refill from scratch
    with pytest.raises(ValueError, match="finite"):
        fresh.restore(Learnt(fresh.gate.sketch.sample_size, b"", 0, float("nan")))


def test_file_round_trips_and_says_why_it_is_not_used():
    door = Doorkeeper(100)
    door.admits(key(1), None)
    data = sightings.encode("doorkeeper", door.learnt())
    assert sightings.decode(data, "doorkeeper") == door.learnt()
    with pytest.raises(ValueError, match="policy changed: doorkeeper -> adaptive"):
        sightings.decode(data, "adaptive")
    with pytest.raises(ValueError, match="shorter than"):
        sightings.decode(data[:10], "doorkeeper")
    with pytest.raises(ValueError, match="not an admission state"):
        sightings.decode(b"X" * len(data), "doorkeeper")
    for at in (sightings.HEADER.size, len(data) - 1):  # a counter changed, or the file cut short
        damaged = bytearray(data)
        damaged[at] ^= 1
        with pytest.raises(ValueError, match="damaged"):
            sightings.decode(bytes(damaged), "doorkeeper")
        with pytest.raises(ValueError, match="damaged"):
            sightings.decode(data[:at], "doorkeeper")


def test_a_place_restores_only_what_fits_and_never_raises(tmp_path):
    path = tmp_path / "kv.admission"
    door = Doorkeeper(100)
    place = sightings.Place("dram", "doorkeeper", door, path)
    assert place.restore() == "no saved state"
    place.save(Doorkeeper(200).learnt())  # the tier's capacity changed since
    assert place.restore() == "sketch: 3200 sightings per halving, expected 1600"
    path.write_bytes(b"garbage")
    assert place.restore() == "7 bytes: shorter than the 72-byte header"
    assert door.admits(key(1), None) is False  # fresh: a first sighting


# ---- the service ----


def test_a_restarted_sidecar_admits_a_block_on_its_second_sighting_across_the_restart(root):
    full: dict[str, Any] = {**DOORKEEPER, "dram": {"admission": "doorkeeper", "capacity_bytes": 2 * BLOCK}}
    service = make(root, **full)
    assert service.stats()["admission_state"] == {"dram": "no saved state"}
    put(service, [10, 11])  # fills it: from here the doorkeeper decides
    assert service.reserve(Owner(), [key(1)]) == [None]  # first sighting: refused
    service.close()  # a clean stop saves
    again = make(root, **full)
    try:
        put(again, [10, 11])  # full again (whatever the restart recovered)
        assert again.stats()["admission_state"] == {"dram": "restored"}
        slots = again.reserve(Owner(), [key(1), key(2)])
        assert slots[0] is not None and not again.is_staging(slots[0])  # second sighting: a DRAM slot
        assert slots[1] is None  # a block never seen before is still refused
    finally:
        again.close()


def test_state_is_saved_while_serving_so_a_crash_keeps_it(root):
    service = make(root, **DOORKEEPER)
    try:
        service.reserve(Owner(), [key(1)])
        service.save_admission_state()  # what the keeper's thread does every SAVE_EVERY_S
        saved = (root / "shm" / "kv.admission").read_bytes()
    finally:
        service.close()
    (root / "shm" / "kv.admission").write_bytes(saved)  # as a killed sidecar would have left it
    again = make(root, **DOORKEEPER)
    try:
        assert again.reserve(Owner(), [key(1)])[0] is not None
    finally:
        again.close()


def test_the_keepers_thread_saves_on_its_own(root):
    door = Doorkeeper(10)
    places = [sightings.Place("dram", "doorkeeper", door, root / "a.admission", every_s=0.05)]
    keeper, outcome = sightings.open_places(places)
    assert outcome == {"dram": "no saved state"} and keeper is not None
    try:  # bounded: up to a minute on a loaded machine
        wait_for(places[0].path.exists, 60, "the keeper's first save", interval_s=0.1)
    finally:
        keeper.stop()


def test_only_a_changed_state_is_written_and_only_when_due(tmp_path):
    door = Doorkeeper(10)
    place = sightings.Place("nvme", "doorkeeper", door, tmp_path / "admission.bin", every_s=3600)
    keeper, _ = sightings.open_places([place])
    assert keeper is not None
    try:
        keeper.save(due_only=True)  # the first interval has not passed
        assert not place.path.exists()
        assert place.save(door.learnt()) is True
        assert place.save(door.learnt()) is False  # an idle tier: no drive writes
        door.admits(key(1), None)
        assert place.save(door.learnt()) is True
        assert sightings.decode(place.path.read_bytes(), "doorkeeper") == door.learnt()
    finally:
        keeper.stop()


def test_a_failing_save_is_logged_once_and_its_end_too(tmp_path, monkeypatch, caplog):
    door = Doorkeeper(10)
    place = sightings.Place("nvme", "doorkeeper", door, tmp_path / "admission.bin", every_s=3600)
    keeper, _ = sightings.open_places([place])
    assert keeper is not None
    full = OSError(errno.ENOSPC, "No space left on device")

    def no_room(self: sightings.Place, learnt: Learnt) -> bool:
        raise full

    try:
        with caplog.at_level(logging.INFO, logger="strata.worker.kvtier.sightings"):
            monkeypatch.setattr(sightings.Place, "save", no_room)
            keeper.save()
            keeper.save()
            monkeypatch.undo()
            keeper.save()
        said = [r.getMessage() for r in caplog.records if r.name.endswith("sightings")]
        assert said[-2:] == [
            "nvme: admission state not saved: [Errno 28] No space left on device",
            "nvme: admission state saved again",
        ]
        assert sum("not saved" in line for line in said) == 1
        assert place.path.exists()
    finally:
        keeper.stop()


def test_a_save_beside_the_dram_tier_waits_for_its_pages_and_leaves_room(tmp_path):
    """On the memory-backed volume a write past its size is a SIGBUS in whoever touches a page
    next: the state is saved only once the DRAM tier's pages are allocated, and only with
    ``leave_free`` to spare."""
    door = Doorkeeper(10)
    allocated = threading.Event()
    place = sightings.Place("dram", "doorkeeper", door, tmp_path / "kv.admission", ready=allocated.is_set)
    assert place.save(door.learnt()) is False and not place.path.exists()  # the pages first
    allocated.set()
    place.leave_free = shutil.disk_usage(tmp_path).total  # more than the volume could ever spare
    with pytest.raises(OSError, match="would leave less than") as failed:
        place.save(door.learnt())
    assert failed.value.errno == errno.ENOSPC and not place.path.exists()
    place.leave_free = sightings.SHM_LEAVE_FREE
    assert place.save(door.learnt()) is True


def test_the_keeper_copies_no_sketch_while_the_dram_tier_is_still_allocating(tmp_path):
    """Exporting a sketch costs a copy of its counters; while the place cannot be written yet,
    the keeper does not make one."""
    door = Doorkeeper(10)
    exports: list[int] = []
    learnt = door.learnt

    def counted() -> Any:
        exports.append(1)
        return learnt()

    door.learnt = counted  # type: ignore[method-assign]
    allocated = threading.Event()
    place = sightings.Place("dram", "doorkeeper", door, tmp_path / "kv.admission", ready=allocated.is_set)
    keeper = sightings.Keeper([place])
    try:
        keeper.save()
        assert exports == [] and not place.path.exists()
        allocated.set()
        keeper.save()
        assert exports == [1] and place.path.exists()
    finally:
        keeper.stop()


def test_a_tier_that_does_not_survive_a_restart_keeps_nothing(root, caplog):
    leftover = root / "nvme"
    leftover.mkdir()
    (leftover / "admission.bin").write_bytes(b"from an older run")
    overrides: dict[str, Any] = {
        "dram": {"admission": "adaptive", "persistent": False},
        "nvme": {"admission": "doorkeeper", "persistent": False},
    }
    service = make(root, **overrides)
    try:
        states = service.stats()["admission_state"]
        assert states == {"dram": "not kept", "nvme": "not kept", "sightings": "not kept"}
        assert not (leftover / "admission.bin").exists()
    finally:
        service.close()
    assert not (root / "shm" / "kv.admission").exists()


@pytest.mark.parametrize("nvme_persistent", [False, True])
def test_admit_after_hits_counts_survive_with_whichever_tier_survives(root, nvme_persistent):
    """With NVMe persistent they live on NVMe; else beside DRAM, so that a DRAM block a restart
    recovered is still written down at its eviction."""
    overrides: dict[str, Any] = {"nvme": {"admit_after_hits": 1, "persistent": nvme_persistent}}
    service = make(root, **overrides)
    try:
        for _ in range(2):
            service.state.require().saw(key(5))
    finally:
        service.close()
    again = make(root, **overrides)
    try:
        states = again.stats()["admission_state"]
        assert isinstance(states, dict) and states["sightings"] == "restored"
        assert again.state.require().seen.count(key(5)) == 2
        assert again.state.require().seen.count(key(6)) == 0
    finally:
        again.close()
    kept, gone = root / "nvme" / "sightings.bin", root / "shm" / "kv.sightings"
    kept, gone = (kept, gone) if nvme_persistent else (gone, kept)
    assert kept.exists() and not gone.exists()


def test_sighting_counts_reach_past_the_doorkeepers_ceiling_and_fade_by_halves():
    counts = SightingCounts(capacity=4)  # a window of 64 sightings
    for _ in range(40):
        counts.saw(key(1))  # admit_after_hits goes up to 100: counts must pass 15
    assert counts.count(key(1)) == 40 and counts.count(key(2)) == 0
    for n in range(100, 124):  # the window's other sightings: a halving
        counts.saw(key(n))
    assert counts.count(key(1)) == 20


def test_a_changed_policy_starts_fresh_and_says_so(root, caplog):
    make(root, **DOORKEEPER).close()
    with caplog.at_level(logging.WARNING, logger="strata.worker.kvtier.sightings"):
        service = make(root, dram={"admission": "adaptive"}, nvme={"capacity_bytes": 0})
    try:
        assert service.stats()["admission_state"] == {"dram": "policy changed: doorkeeper -> adaptive"}
        assert "dram: admission state: policy changed: doorkeeper -> adaptive" in caplog.text
    finally:
        service.close()


# ---- why: the conversation trace with a restart in the middle ----


def replay_with_restart(trace: list[list[int]], restart: int, keep: bool | None) -> float:
    """Hit ratio after request ``restart`` of an adaptive 1k-block tier: never restarted
    (``keep`` None), or restarted there with its saved state (True) or without (False)."""
    cache = simulate.Cache(1000, "prefix-aware", "adaptive")
    for chain in trace[:restart]:
        cache.request(chain)
    if keep is not None:
        learnt = cache.index.admission.learnt()
        assert learnt is not None
        cache.index.admission = admission.make_admission("adaptive", 1000, "prefix-aware")
        if keep:
            cache.index.admission.restore(sightings.decode(sightings.encode("adaptive", learnt), "adaptive"))
    after = trace[restart:]
    return sum(cache.request(chain) for chain in after) / sum(len(chain) for chain in after)


@pytest.mark.skipif(not (TRACES / "mooncake_conversation.jsonl").exists(), reason="no traces")
def test_adaptive_restarted_with_its_state_hits_as_if_never_restarted():
    trace = simulate.load_trace(TRACES / "mooncake_conversation.jsonl")[:4000]
    never, kept, lost = (replay_with_restart(trace, 2500, keep) for keep in (None, True, False))
    assert kept == never
    assert lost < 0.97 * never, (lost, never)  # 0.073 against 0.076
