"""What each tier's admission policy has learnt, kept in a file beside the tier's blocks, so a
restarted sidecar admits as it did before the restart.

Why: a restarted ``adaptive`` policy starts from a score of 0 (``always``) with empty shadow
tiers, and takes thousands of requests to find its way back to the doorkeeper. Replaying the
conversation trace with a 5k-block tier restarted after request 6,000, the next 1,000
requests hit 0.101 against 0.176 without the restart, and the rest of the trace 0.157 against
0.179. Keeping the doorkeeper's sketch and the score gives back exactly the unrestarted
figures (docs/kvtier.md, "Restarts: what survives").

Where: ``<dram.shm_path>.admission`` for DRAM (the pod's memory-backed volume, beside the slot
table) and ``<nvme.path>/admission.bin`` for NVMe; only for a tier that survives a restart
(``persistent``), otherwise the file is removed so no later run trusts it. The NVMe tier's
``admit_after_hits`` counts (``SightingCounts``) go to ``<nvme.path>/sightings.bin`` when NVMe
survives, else to ``<dram.shm_path>.sightings`` when DRAM does (the service decides).

When: every ``SAVE_EVERY_S`` (``NVME_SAVE_EVERY_S`` on NVMe) from a background thread, if it
changed, and at a clean stop; written to a temporary name, synced and renamed into place, so a
crash leaves the previous file whole. A
file is used only when its policy and sketch size are the configured ones and its checksum
holds; anything else starts fresh, with the reason in the log and in ``stats``.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import shutil
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import xxhash

from strata.worker.kvtier.admission import Learner, Learnt
from strata.worker.kvtier.background import Loop

log = logging.getLogger(__name__)

MAGIC = b"STRATA-ADMIT-v1\0"  # the last byte before the NUL names the format's version
HEADER = struct.Struct("<16s16sQQdQQ")  # magic, policy, sample size, added, score, length, xxh3
SIGHTINGS = "admit_after_hits"  # the policy name the NVMe tier's sighting counts are saved under
SAVE_EVERY_S = 30.0  # a crash loses at most this much learning; a save costs milliseconds
# On NVMe less often: its sketch is the largest (32 MiB for 1M blocks) and costs drive writes.
NVME_SAVE_EVERY_S = 300.0
# What a save leaves free on the pod's memory-backed /dev/shm: the engine's own use of it (torch
# IPC) and the DRAM tier's pages come first; the admission state is worth less than either.
SHM_LEAVE_FREE = 64 << 20


def dram_sightings_path(shm_path: str | Path) -> Path:
    """Where the counts are saved beside a DRAM tier's slots (when NVMe does not persist)."""
    return Path(f"{shm_path}.sightings")


def header(policy: str, learnt: Learnt, digest: int) -> bytes:
    """The file's first ``HEADER.size`` bytes (``digest``: the counters' xxh3); the counters
    follow."""
    return HEADER.pack(
        MAGIC, policy.encode(), learnt.sample_size, learnt.added, learnt.score, len(learnt.table), digest
    )


def encode(policy: str, learnt: Learnt) -> bytes:
    return header(policy, learnt, xxhash.xxh3_64_intdigest(learnt.table)) + learnt.table


def decode(data: bytes, policy: str) -> Learnt:
    """The state ``encode`` wrote for ``policy``; ValueError saying what does not fit."""
    if len(data) < HEADER.size:
        raise ValueError(f"{len(data)} bytes: shorter than the {HEADER.size}-byte header")
    magic, name, sample_size, added, score, length, digest = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise ValueError("not an admission state of this format")
    saved = name.rstrip(b"\0").decode(errors="replace")
    if saved != policy:
        raise ValueError(f"policy changed: {saved} -> {policy}")
    table = data[HEADER.size :]
    if len(table) != length or xxhash.xxh3_64_intdigest(table) != digest or not math.isfinite(score):
        raise ValueError("damaged: its checksum does not match")
    return Learnt(sample_size, table, added, score)


@dataclass
class Place:
    """One tier's admission policy (or the NVMe tier's ``admit_after_hits`` counts) and the
    file its state is kept in."""

    tier: str
    policy: str
    learner: Learner
    path: Path
    persistent: bool = True  # the tier's blocks survive a restart: so may what admitted them
    every_s: float = SAVE_EVERY_S
    due: float = 0.0  # time.monotonic() of the next periodic save
    written: tuple[int, int, float] | None = None  # (xxh3, added, score) of what is on disk
    # On the memory-backed volume: saves wait until the DRAM tier's pages are all allocated,
    # and leave this much free (a page fault on a full tmpfs is a SIGBUS, not an error).
    ready: Callable[[], bool] | None = None
    leave_free: int = 0

    def restore(self) -> str:
        """Takes the saved state back: ``restored``, or why not."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return "no saved state"
        except OSError as err:
            return f"unreadable: {err}"
        try:
            self.learner.restore(decode(data, self.policy))
        except ValueError as err:
            return str(err)
        return "restored"

    def save(self, learnt: Learnt) -> bool:
        """Writes ``learnt`` unless it is what the file already holds (an idle tier learns
        nothing, and an NVMe tier's sketch is worth no drive writes then)."""
        if self.waiting():
            return False
        digest = xxhash.xxh3_64_intdigest(learnt.table)
        if self.written == (digest, learnt.added, learnt.score):
            return False
        self._check_room(HEADER.size + len(learnt.table))
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "wb") as out:
            out.write(header(self.policy, learnt, digest))
            out.write(learnt.table)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, self.path)
        self.written = (digest, learnt.added, learnt.score)
        return True

    def waiting(self) -> bool:
        """Not yet: the volume's pages go to the DRAM tier first."""
        return self.ready is not None and not self.ready()

    def _check_room(self, size: int) -> None:
        """ENOSPC unless a temporary copy of ``size`` bytes leaves ``leave_free`` free."""
        if not self.leave_free:
            return
        free = shutil.disk_usage(self.path.parent).free
        if free < size + self.leave_free:
            raise OSError(
                errno.ENOSPC,
                f"{size} bytes would leave less than {self.leave_free} of {free} free on {self.path.parent}",
            )


class Keeper:
    """Saves each place's state every ``Place.every_s`` (when it changed) and once more at
    ``stop``, without the service's lock: the counters are copied a slice at a time while
    requests go on (``FrequencySketch.export``), a millisecond or so per 4 MiB of them (the
    sketch of a DRAM tier of 128k blocks)."""

    def __init__(self, places: list[Place]) -> None:
        self.places = places
        self._failing: set[str] = set()  # tiers whose last save failed
        self._saving = threading.Lock()  # the loop's save and an asked-for one write one file
        now = time.monotonic()
        for place in places:  # what was just restored is not due again for an interval
            place.due = now + place.every_s
        wake_s = min(place.every_s for place in places)
        self._loop = Loop("sightings", self._save_step, wake_s=wake_s)

    def save(self, due_only: bool = False) -> None:
        """Every place now, or (``due_only``) those whose interval has passed."""
        with self._saving:
            now = time.monotonic()
            for place in self.places:
                if due_only and now < place.due:
                    continue
                place.due = now + place.every_s
                if place.waiting():
                    continue  # no export of a sketch that would not be written
                learnt = place.learner.learnt()
                if learnt is not None:
                    self._save(place, learnt)

    def _save(self, place: Place, learnt: Learnt) -> None:
        """One place; a failure (a full volume) is logged when it starts and when it ends, not
        every interval, and the tier serves on either way."""
        try:
            place.save(learnt)
        except OSError as err:
            place.path.with_name(place.path.name + ".tmp").unlink(missing_ok=True)
            if place.tier not in self._failing:
                self._failing.add(place.tier)
                log.warning(
                    "%s: admission state not saved: %s",
                    place.tier,
                    err,
                    extra={"event": "admission_state", "tier": place.tier, "state": "unsaved"},
                )
            return
        if place.tier in self._failing:
            self._failing.discard(place.tier)
            log.info(
                "%s: admission state saved again",
                place.tier,
                extra={"event": "admission_state", "tier": place.tier, "state": "saved"},
            )

    def stop(self) -> None:
        self._loop.stop()
        self.save()

    def _save_step(self) -> bool:
        self.save(due_only=True)
        return False


def open_places(places: list[Place]) -> tuple[Keeper | None, dict[str, str]]:
    """Restore what a previous run saved for each persistent place whose policy learns, and
    remove the others' files. Returns the keeper of the places to save (None when there are
    none) and each tier's outcome."""
    kept: list[Place] = []
    outcome: dict[str, str] = {}
    for place in places:
        if not place.persistent or place.policy == "always":
            place.path.unlink(missing_ok=True)
            outcome[place.tier] = "nothing to keep" if place.policy == "always" else "not kept"
            continue
        outcome[place.tier] = place.restore()
        _log_outcome(place.tier, outcome[place.tier])
        kept.append(place)
    return (Keeper(kept) if kept else None), outcome


def _log_outcome(tier: str, outcome: str) -> None:
    say: Callable[..., None] = log.info if outcome in ("restored", "no saved state") else log.warning
    say(
        "%s: admission state: %s",
        tier,
        outcome,
        extra={"event": "admission_state", "tier": tier, "state": outcome},
    )
