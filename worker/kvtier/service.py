"""The sidecar's block service: lookup, get, reserve/put, prefetch, pin, across the tiers.

It owns the tiers, the connections' leases and reservations, pins and retention; how blocks
move between tiers is ``movement``'s job. A block is served only after its checksum matched
(here, or by the reading client along its copy out), and a block that fails is dropped from
its tier and counted. One lock serialises index changes; the disks are read and written
without it (a load's and a prefetch's reads: ``_promote``; saves: the commit thread), the
bytes of a batch moving on the NVMe store's I/O threads.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from strata.common.kvbudget import (
    MAX_EXPECTED,
    MAX_EXPECTED_BLOCKS,
    STAGING_SLOTS,
    Blocks,
    Fit,
    asked_blocks,
    fit,
    fixed_bytes,
    slot_bytes_for,
    staging_slots_for,
)
from strata.worker.block_events import BlockEvents
from strata.worker.cgroup import memory_limit
from strata.worker.config import KVTierConfig
from strata.worker.kvtier import direct, promotion
from strata.worker.kvtier.arena import SlotArena
from strata.worker.kvtier.demoter import Demoter
from strata.worker.kvtier.index import Entry, TierIndex
from strata.worker.kvtier.janitor import Janitor
from strata.worker.kvtier.metrics import TierMetrics
from strata.worker.kvtier.movement import Mover
from strata.worker.kvtier.nvme import NvmeStore, Record
from strata.worker.kvtier.recovery import Found, Recovery, open_table
from strata.worker.kvtier.sealer import Sealer
from strata.worker.kvtier.shared import FilesystemBlockStore
from strata.worker.kvtier.shm import shm_room
from strata.worker.kvtier.sightings import (
    NVME_SAVE_EVERY_S,
    SHM_LEAVE_FREE,
    SIGHTINGS,
    Keeper,
    Place,
    dram_sightings_path,
    open_places,
)
from strata.worker.kvtier.tiers import DramTier, NvmeTier, SharedTier
from strata.worker.kvtier.writedown import WritePlan

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PutBlock:
    key: bytes
    parent: bytes
    slot: int
    checksum: int | None = None  # the client's, of the slot's bytes; None: taken in the background


@dataclass
class Owner:
    """What one client connection holds: leased slots (being read) and reserved slots (being
    written). Released when the connection ends, whatever state the client died in."""

    source: str = "engine"  # whose queue its look-ahead comes from: the engine's, or the routers'
    leases: list[int] = field(default_factory=list)
    reserved: set[int] = field(default_factory=set)
    expected: OrderedDict[str, list[bytes]] = field(default_factory=OrderedDict)  # queued requests
    expected_blocks: int = 0  # their keys, counted
    next_ask: list[bytes] | None = None  # what the last answer left of its get: asked for next
    ahead: ReadAhead | None = None  # the answer to ``next_ask``, read before it was asked
    direct_io: bool = False  # its engine writes NVMe slots itself (``KVTierService.direct_io``)
    direct: dict[int, Record] = field(default_factory=dict)  # NVMe slots reserved for it, by slot
    nvme_leases: list[int] = field(default_factory=list)  # NVMe slots its engine is reading
    nvme_refused: set[bytes] = field(default_factory=set)  # staged at a direct reserve: NVMe said no


@dataclass
class ReadAhead:
    """An answer read before its get arrived: its slots are leased to the owner already."""

    asked: list[bytes]
    found: list[tuple[int, int | None]]
    next_ask: list[bytes] | None


Block = tuple[bytes, Entry]
PREALLOCATED_WAIT_S = 30.0  # a stop right after a start waits this long, at most, for the DRAM pages
STAGING_WAIT_S = 120.0  # a reserve waits at most this long for in-flight puts' staging slots
PROMOTION_WAIT_S = 1.0  # how long a wait for another promotion's read sleeps before it looks again
MIN_ANSWER = 8  # blocks: a load's answers from the lower tiers are not cut shorter than this
PREFETCH_MEMORY = 1 << 16  # origins remembered for prefetched blocks not yet looked up


class KVTierService:
    def __init__(
        self,
        config: KVTierConfig,
        metrics: TierMetrics | None = None,
        staging_slots: int | None = None,
        background_demotion: bool = True,
    ) -> None:
        self.config = config
        self.background_demotion = background_demotion  # off: demotion only when room is needed
        self.metrics = metrics or TierMetrics()
        self.events = BlockEvents()  # what each tier holds, for routers (GET /kv/events)
        self._staging_asked = staging_slots  # None: as many as KVTIER_STAGING_BYTES holds
        self.staging_slots = staging_slots or STAGING_SLOTS
        self.block_bytes = 0
        self.slot_bytes = 0
        self.dram: DramTier | None = None
        self.nvme: NvmeTier | None = None
        self.shared: SharedTier | None = None
        self.memory: Fit | None = None  # what each tier may index within the sidecar's memory
        self._expect_refused = 0  # announced requests past MAX_EXPECTED_BLOCKS
        self._lock = threading.RLock()
        self._mover: Mover | None = None
        self._demoter: Demoter | None = None  # write-back with a lower tier: keeps DRAM slots free
        self._sealer: Sealer | None = None  # checksums of saved DRAM blocks, off the engine's path
        self._recovery: Recovery | None = None  # DRAM blocks a restart found, being verified
        self._keeper: Keeper | None = None  # saves what the admission policies learnt
        self._janitor: Janitor | None = None  # keeps the shared volume within its size, if ours
        self._admission_state: dict[str, str] = {}  # per tier: restored at start, or why not
        self._found = Found()  # what the DRAM slot table held at start
        self._pinned: set[bytes] = set()  # shared with the mover; pins may precede a block
        # Blocks a prefetch promoted to DRAM, by the tier they came from: a lookup reports that
        # tier, so per-tier hit metrics credit NVMe/shared even when the prefetch won the race.
        self._prefetched_from: OrderedDict[bytes, str] = OrderedDict()
        self._background = ThreadPoolExecutor(1, thread_name_prefix="kvtier-prefetch")
        # Staging puts' commits, in order (one thread: the index log's records stay in put order).
        self._committer = ThreadPoolExecutor(1, thread_name_prefix="kvtier-commit")
        self._writing = 0  # staging puts queued and not committed yet (their slots still held)
        self._room = threading.Condition(self._lock)  # notified when a put's staging slots are back
        self._reading = 0  # promotions reading with the lock released (``_promote``)
        self._promoted = threading.Condition(self._lock)  # notified as each of them commits
        self._closed = False
        # Checksums of a batch in parallel (the hash releases the GIL on large buffers).

    # ---- set-up ----

    def configure(self, block_bytes: int) -> dict[str, object]:
        """Size the tiers for the engine's block size (first client, or ``--block-bytes``)."""
        with self._lock:
            if self.dram is None:
                self._build(block_bytes)
                self._say_direct_io()
            elif block_bytes != self.block_bytes:
                raise ValueError(
                    f"block_bytes: sidecar holds {self.block_bytes}-byte blocks, got {block_bytes}"
                )
            assert self.dram is not None
            return {
                "block_bytes": self.block_bytes,
                "slot_bytes": self.slot_bytes,
                "num_slots": self.dram.arena.num_slots,
                "shm_path": str(self.dram.arena.path),
                # A batch this size always finds slots (staging when DRAM is full or pinned).
                "max_batch": self.staging_slots,
                "direct_io": direct.refusal(self.nvme, self.shared, self.config.write_mode) is None,
            }

    def _say_direct_io(self) -> None:
        """Once, as the tiers are built: whether engines may read and write NVMe blocks
        themselves, and if not why (an admin wondering why ``direct_written_bytes`` stays at 0
        finds it here). Nothing where there is no NVMe tier: nothing to stage either."""
        if self.nvme is None:
            return
        why = direct.refusal(self.nvme, self.shared, self.config.write_mode)
        offer = "may read and write their NVMe blocks themselves" if why is None else "stage NVMe blocks"
        log.info(
            "kvtier: engines %s (direct_io)%s",
            offer,
            f": {why}" if why else "",
            extra={"event": "direct_io_offer", "offered": why is None, "reason": why},
        )

    def direct_io(self, owner: Owner) -> tuple[int, int]:
        """Let ``owner``'s engine write the blocks NVMe takes into their slots itself (see
        ``direct``): the NVMe data file's ``O_DIRECT`` descriptor (the caller passes it on, and
        keeps it open) and the slot size. Refused, naming why (``direct.refusal``): no NVMe
        tier, no ``O_DIRECT``, blocks not whole pages, a shared tier written through."""
        with self._lock:
            self._require()
            why = direct.refusal(self.nvme, self.shared, self.config.write_mode)
            if why is not None:
                raise ValueError(f"direct_io: not offered: {why}")
            assert self.nvme is not None and self.nvme.store.direct_fd is not None
            owner.direct_io = True
            log.info(
                "kvtier: a client reads and writes its NVMe blocks itself (direct_io)",
                extra={"event": "direct_io", "slot_bytes": self.nvme.store.slot_bytes},
            )
            return self.nvme.store.direct_fd, self.nvme.store.slot_bytes

    def _build(self, block_bytes: int) -> None:
        cfg = self.config
        self.block_bytes, self.slot_bytes = block_bytes, slot_bytes_for(block_bytes)
        self.staging_slots = self._staging_asked or staging_slots_for(self.slot_bytes)
        self.memory = self._fit_memory()
        dram_slots = self.memory.fitted.dram
        arena = SlotArena(cfg.dram.shm_path, self.slot_bytes, dram_slots + self.staging_slots, create=True)
        threading.Thread(target=arena.preallocate, name="kvtier-preallocate", daemon=True).start()
        table, self._found = open_table(cfg, arena, dram_slots, block_bytes)
        held = [record.slot for record in self._found.records]
        eviction, admission = cfg.dram.eviction, cfg.dram.admission
        self.dram = DramTier(arena, dram_slots, block_bytes, eviction, admission, table, held)
        nvme_slots = self.memory.fitted.nvme
        if nvme_slots:
            store = NvmeStore(cfg.nvme.path, self.slot_bytes, block_bytes, nvme_slots, cfg.nvme.io_threads)
            expires = cfg.retention_s is not None
            self.nvme = NvmeTier(store, cfg.nvme.persistent, cfg.nvme.eviction, cfg.nvme.admission, expires)
        if cfg.shared.enabled:
            self._janitor = Janitor(Path(cfg.shared.path), cfg.shared.capacity_bytes, self.metrics.swept)
            volume = FilesystemBlockStore(cfg.shared.path)
            self.shared = SharedTier(volume, self.memory.fitted.shared, on_full=self._janitor.full)
            self._janitor.start()
        self._mover = Mover(cfg, self.metrics, (self.dram, self.nvme, self.shared), self._pinned)
        if dram_slots:
            self._sealer = Sealer(self._lock, self.dram)
        lower = self.nvme is not None or self.shared is not None
        if self.background_demotion and cfg.write_mode == "write-back" and dram_slots and lower:
            self._demoter = Demoter(self._lock, self._mover, self.staging_slots)
        for name, tier in (("dram", self.dram), ("nvme", self.nvme), ("shared", self.shared)):
            if tier is not None:
                tier.index.watch(self.events, name)
        if self._found.records:
            self._recovery = Recovery(self._lock, self._mover, self._found)
        self._keeper, self._admission_state = open_places(self._admission_places())
        self._publish_capacity()
        log.info("kvtier: dram %d, nvme %d slots of %d bytes", dram_slots, nvme_slots, self.slot_bytes)

    def _fit_memory(self) -> Fit:
        """The blocks each tier may index within the sidecar's memory (``budget``)."""
        cfg, slot_bytes = self.config, self.slot_bytes
        asked = asked_blocks(cfg, self.block_bytes)
        fixed = fixed_bytes(cfg, asked, slot_bytes, self.staging_slots)
        shm = shm_room(Path(cfg.dram.shm_path), self.staging_slots * slot_bytes)
        fitted = fit(asked, memory_limit(cfg.memory_bytes), fixed, slot_bytes, shm)
        if fitted.clipped:
            log.warning(
                "kvtier: %d-byte blocks: fitted within %s bytes of memory and %s of /dev/shm: %s of %s; "
                "give the service spec.model.kvBytesPerToken (the engine logs its model's at its start) "
                "and the operator sizes the sidecar for them",
                self.block_bytes,
                fitted.limit,
                fitted.shm,
                fitted.fitted,
                fitted.asked,
                extra={"event": "memory_fit", **fitted.report()},
            )
        return fitted

    def _admission_places(self) -> list[Place]:
        """Each tier whose admission policy may keep what it learnt (``sightings``)."""
        cfg, places = self.config, []
        if self.dram is not None and self.dram.capacity:
            path = Path(f"{self.dram.arena.path}.admission")
            admission = self.dram.index.admission
            place = Place("dram", cfg.dram.admission, admission, path, cfg.dram.persistent)
            places.append(self._in_shm(place))
        if self.nvme is not None:
            path = Path(cfg.nvme.path) / "admission.bin"
            admission = self.nvme.index.admission
            places.append(
                Place("nvme", cfg.nvme.admission, admission, path, cfg.nvme.persistent, NVME_SAVE_EVERY_S)
            )
            places.append(self._sightings_place())
        return places

    def _sightings_place(self) -> Place:
        """``nvme.admit_after_hits``' counts: kept with the NVMe tier when it survives a
        restart, else with DRAM when that does (a DRAM block a restart recovered is still
        written down at its eviction, as it would have been)."""
        cfg, mover = self.config, self._require()
        counts, dram = mover.seen, mover.dram
        on_nvme, in_dram = Path(cfg.nvme.path) / "sightings.bin", dram_sightings_path(dram.arena.path)
        if cfg.nvme.persistent:
            in_dram.unlink(missing_ok=True)
            return Place("sightings", SIGHTINGS, counts, on_nvme, every_s=NVME_SAVE_EVERY_S)
        on_nvme.unlink(missing_ok=True)
        return self._in_shm(
            Place("sightings", SIGHTINGS, counts, in_dram, cfg.dram.persistent and dram.capacity > 0)
        )

    def _in_shm(self, place: Place) -> Place:
        """A place beside the DRAM tier, on the memory-backed volume: saved once the tier's pages
        are all allocated, and only with room to spare."""
        assert self.dram is not None
        place.ready, place.leave_free = self.dram.arena.preallocated.is_set, SHM_LEAVE_FREE
        return place

    def save_admission_state(self) -> None:
        """Save what the admission policies learnt now (also every ``SAVE_EVERY_S``, and at
        ``close``)."""
        if self._keeper is not None:
            self._wait_preallocated()
            self._keeper.save()  # every place, due or not

    def _wait_preallocated(self) -> None:
        """A save asked for (or the last, at ``close``) waits, boundedly, for the DRAM tier's
        pages: until then the places beside it do not save (``_in_shm``). Only a keeper's
        saves need them: a sidecar with none stops at once."""
        if self.dram is not None and self._keeper is not None:
            self.dram.arena.preallocated.wait(PREALLOCATED_WAIT_S)

    def _publish_capacity(self) -> None:
        m = self.metrics
        asked = self.memory.asked if self.memory else Blocks(0, 0, 0)
        for name, tier_capacity, configured in (
            ("dram", self.dram.capacity if self.dram else 0, asked.dram),
            ("nvme", self.nvme.index.capacity if self.nvme else 0, asked.nvme),
            ("shared", self.shared.index.capacity if self.shared else 0, asked.shared),
        ):
            m.capacity_bytes.labels(name).set(tier_capacity * self.block_bytes)
            m.configured_bytes.labels(name).set(configured * self.block_bytes)
        self._require().publish_usage()

    def _poke_demoter(self) -> None:
        if self._demoter is not None:
            self._demoter.poke()

    def _require(self) -> Mover:
        if self._mover is None:
            raise RuntimeError("sidecar not configured: send hello with block_bytes first")
        return self._mover

    # ---- lookup ----

    def lookup(self, keys: Sequence[bytes]) -> list[str]:
        with self._lock:
            self._claim(keys)
            found: list[str] = []
            for key in keys:
                tier = self._where(key)
                if tier is None:
                    break
                found.append(tier)
            return found

    def _claim(self, keys: Sequence[bytes]) -> None:
        """Blocks a restart found and has not verified yet: verified and admitted now, when a
        request names them (``recovery``)."""
        if self._recovery is not None and self._recovery.pending:
            self._recovery.claim(list(keys))

    def _where(self, key: bytes) -> str | None:
        m = self.metrics
        if self.dram is not None and (key in self.dram.index or key in self._require().demoting):
            origin = self._prefetched_from.pop(key, None)
            if origin is not None:
                m.prefetch_used.labels(origin).inc()
            tier = origin or "dram"
            m.hits.labels(tier).inc()
            return tier
        m.misses.labels("dram").inc()
        if self.nvme is not None and key in self.nvme.index:
            m.hits.labels("nvme").inc()
            return "nvme"
        m.misses.labels("nvme").inc()
        if self.shared is not None and self.shared.contains(key):
            m.hits.labels("shared").inc()
            return "shared"
        m.misses.labels("shared").inc()
        return None

    # ---- get: into leased slots ----

    def get(self, owner: Owner, keys: Sequence[bytes]) -> list[tuple[int, int | None]]:
        """(slot, checksum) of the leading blocks now in shared memory, leased to ``owner``:
        all DRAM holds, and from the lower tiers at most half the staging slots, so that the
        client's next ask can be read while it copies this answer out. The checksum is None
        where the client has nothing to check (see ``_to_verify``). An answer read ahead
        (``read_ahead``) for exactly these keys is handed over as it is, unless it found no
        room then (all staging slots leased): then it is read now."""
        with self._lock:
            ahead, owner.ahead = owner.ahead, None
            if ahead is not None and ahead.found and ahead.asked == list(keys):
                owner.next_ask = ahead.next_ask
                return ahead.found
            if ahead is not None:
                self._unlease(owner, [slot for slot, _ in ahead.found])
            found = self._get(owner, keys)
            owner.next_ask = _left(keys, found)
            return found

    def get_direct(self, owner: Owner, keys: Sequence[bytes]) -> list[tuple[int, int | None]] | None:
        """``get`` for an engine granted ``direct_io`` by a sidecar without a DRAM tier (where
        every block read would only pass through a staging slot): the NVMe slots and checksums
        of the leading blocks NVMe holds, leased to ``owner`` until ``release`` names them, for
        the engine to read into its KV cache itself. None where that does not apply (a DRAM
        tier would keep what is read; the first block is not on NVMe, so perhaps on the shared
        tier): ``get`` then."""
        with self._lock:
            mover = self._require()
            nvme = mover.nvme
            if not owner.direct_io or mover.dram.capacity or nvme is None or not keys:
                return None
            if keys[0] not in nvme.index:
                return None
            self.drop_ahead(owner)
            self._claim(keys)
            now, found = time.time(), list[tuple[int, int | None]]()
            for key in keys:
                mover.saw(key)
            for key in keys:
                entry = nvme.index.get(key)
                if entry is None or entry.checksum is None:
                    break
                nvme.index.record_hit(key, entry.parent)
                nvme.index.touch(key, now)
                nvme.lease(entry.slot)  # not rewritten while the engine reads it, even if evicted
                owner.nvme_leases.append(entry.slot)
                found.append((entry.slot, entry.checksum))
            self.metrics.read_bytes.labels("nvme").inc(len(found) * self.block_bytes)
            self.metrics.direct_read_bytes.labels("nvme").inc(len(found) * self.block_bytes)
            return found

    def read_ahead(self, owner: Owner) -> None:
        """Read the answer to what the last answer left of its get (``next_ask``) now, before
        the client asks: its disk reads overlap the client's copy of the answer just sent,
        instead of waiting for the next get's round trip. Held for the owner until its next get
        (handed over when it asks for exactly that), or given back (``drop_ahead``)."""
        try:
            with self._lock:
                asked, owner.next_ask = owner.next_ask, None
                if asked and owner.ahead is None and self._mover is not None:
                    found = self._get(owner, asked)
                    owner.ahead = ReadAhead(asked, found, _left(asked, found))
        except Exception:  # unasked work must never take the connection down: the get reads
            log.exception("kvtier: read-ahead failed")

    def drop_ahead(self, owner: Owner) -> None:
        """The client went on to something else: an answer read ahead goes back unread."""
        with self._lock:
            ahead, owner.ahead, owner.next_ask = owner.ahead, None, None
            if ahead is not None and self._mover is not None:
                self._unlease(owner, [slot for slot, _ in ahead.found])

    def _get(self, owner: Owner, keys: Sequence[bytes]) -> list[tuple[int, int | None]]:
        """``get`` under the lock."""
        mover = self._require()
        dram = mover.dram
        now = time.time()
        out: list[tuple[int, int | None]] = []
        self._claim(keys)
        for key in keys:
            mover.saw(key)
        i = staged = 0
        budget: int | None = None  # staging slots this answer may fill from the lower tiers
        waited: set[bytes] = set()  # blocks this get waited for another read of (counted once)
        while i < len(keys):
            parent = keys[i - 1] if i else None
            entry = dram.index.get(keys[i]) or mover.demoting.get(keys[i])
            if entry is None and keys[i] in mover.promoting:  # another read brings it up: take that
                self._wait_for_read(mover, keys[i], waited)
                mover = self._require()
                continue
            fresh = entry is None
            if entry is not None:
                dram.index.record_hit(keys[i], parent)
                dram.index.touch(keys[i], now)  # no-op for a demoting block
                dram.used(entry)  # and in the slot table, for a restart
                entries = [entry]
            else:
                if budget is None:
                    budget = staging_budget(len(keys) - i, self.answer_blocks)
                room = budget - staged
                entries = self._promote(mover, keys[i : i + room], parent, True) if room > 0 else []
            for entry in entries:
                dram.lease(entry.slot)
                owner.leases.append(entry.slot)
                if dram.is_staging(entry.slot):
                    staged += 1
                    dram.give_back(entry.slot)  # deferred: back in the pool once released
                out.append((entry.slot, self._to_verify(entry, fresh)))
            if not entries:
                break
            i += len(entries)
        self._poke_demoter()
        if self.config.write_mode == "write-through" and self.nvme is not None and out:
            self._background.submit(self._write_through_admitted, list(keys[: len(out)]))
        return out

    def _wait_for_read(self, mover: Mover, key: bytes, waited: set[bytes]) -> None:
        """Wait (lock released) for the read bringing ``key`` up to commit, or a while."""
        if key not in waited:
            waited.add(key)
            self.metrics.read_waits.labels(mover.promoting[key]).inc()
        self._promoted.wait(PROMOTION_WAIT_S)

    def _promote(
        self, mover: Mover, keys: Sequence[bytes], parent: bytes | None, staging_ok: bool
    ) -> list[Entry]:
        """Bring the leading blocks of ``keys`` up from a lower tier (``Mover.plan_promotion``),
        planned and committed under the lock, which is released while the blocks are read: the
        engine's lookups and saves, other loads and the background workers go on meanwhile.
        Called with the lock held once (``get``, ``read_ahead``, a prefetch's run); the state
        the caller read before may have changed when this returns."""
        if self._closed:
            return []
        plan = mover.plan_promotion(keys, parent, staging_ok)
        if plan is None:
            return []
        self._reading += 1
        self._lock.release()
        try:
            promotion.read(plan, mover.dram, mover.nvme, mover.shared)
        finally:
            self._lock.acquire()
            self._reading -= 1
            entries = mover.commit_promotion(plan)
            self._promoted.notify_all()
        return entries

    def _to_verify(self, entry: Entry, fresh: bool) -> int | None:
        """The checksum the client checks its copy against; None when there is nothing to check:
        read from a lower tier into a DRAM slot just now (verified here), not sealed yet, or
        DRAM reads are not verified (``dram.verify_reads``). A block read into a staging slot
        is the client's to check (``Mover.client_checks``)."""
        if fresh and not self._require().client_checks([entry.slot]):
            return None
        return entry.checksum if self.config.dram.verify_reads else None

    def _write_through_admitted(self, keys: list[bytes]) -> None:
        """Write-through with NVMe admission: a block refused at its first put is written down
        once a later read makes it admitted, in the background, off the engine's load path."""
        try:
            with self._lock:
                mover = self._require()
                dram = mover.dram
                resident = [(k, e) for k in keys if (e := dram.index.get(k)) and not dram.is_staging(e.slot)]
                mover.write_down(resident, demoting=False)
                mover.publish_usage()
        except Exception:  # a background copy must never take the sidecar down
            log.exception("kvtier: write-through of admitted blocks failed")

    # ---- reserve / put: the engine writes blocks into slots ----

    def reserve(
        self, owner: Owner, keys: Sequence[bytes], parents: Sequence[bytes | None] | None = None
    ) -> list[int | None]:
        """A slot per key to copy the block into, or None where the tiers already hold it (or
        none would take it). A block DRAM admits gets a DRAM slot; one it refuses gets a
        staging slot when a lower tier may store it. Reserved slots belong to ``owner`` until
        ``put``."""
        return self.reserve_direct(owner, keys, parents, direct=False)[0]

    def reserve_direct(
        self, owner: Owner, keys: Sequence[bytes], parents: Sequence[bytes | None] | None, direct: bool
    ) -> tuple[list[int | None], list[int | None]]:
        """``reserve``; with ``direct`` (an owner granted ``direct_io``), a block DRAM refuses
        gets an NVMe slot for the engine to write itself (second list) where NVMe admits it,
        instead of a staging slot; one NVMe refuses, a staging slot for the shared tier."""
        parents = parents if parents is not None else [None] * len(keys)
        if len(parents) != len(keys):
            raise ValueError("parents: must have one entry per key")
        if direct and not owner.direct_io:
            raise ValueError("direct: this connection was not granted direct_io")
        with self._lock:
            mover = self._require()
            dram = mover.dram
            now = time.time()
            to_dram: list[bytes] = []
            to_staging: set[bytes] = set()
            to_nvme: dict[bytes, Entry] = {}
            self._claim(keys)
            for key, parent in zip(keys, parents, strict=True):
                mover.saw(key)
                if (held := dram.index.get(key) or mover.demoting.get(key)) is not None:
                    dram.index.touch(key, now)
                    dram.used(held)
                elif dram.capacity and key not in to_dram and dram.index.admits(key, parent):
                    to_dram.append(key)
                elif direct and self.nvme is not None and key not in self.nvme.index:
                    to_nvme.setdefault(key, Entry(parent, self.config.priority, False, now))
                elif self._lower_tier_takes(key):
                    to_staging.add(key)
            slots = mover.dram_slots(len(to_dram)) if to_dram else []
            taken = self._take_direct(owner, to_nvme)
            to_staging |= self._refused_for_shared(owner, [k for k in to_nvme if k not in taken])
            self._await_staging(len(to_staging) + len(to_dram) - len(slots))
            self._poke_demoter()
            given: dict[bytes, int | None] = dict(zip(to_dram, slots, strict=False))
            given |= {key: None for key in [*to_dram[len(slots) :], *to_staging]}
            slots_given = [self._assign(owner, key, given) for key in keys]
            owner.nvme_refused -= {key for key, slot in zip(keys, slots_given, strict=True) if slot is None}
            return slots_given, [taken.pop(key, None) for key in keys]

    def _take_direct(self, owner: Owner, blocks: dict[bytes, Entry]) -> dict[bytes, int]:
        """NVMe slots for the engine to write ``blocks`` into, by key: those the tier admits
        and has room for."""
        if not blocks:
            return {}
        records = [r for r in self._require().writer.take_direct(list(blocks.items())) if r is not None]
        owner.direct |= {record.slot: record for record in records}
        return {record.key: record.slot for record in records}

    def _refused_for_shared(self, owner: Owner, keys: list[bytes]) -> set[bytes]:
        """Of the blocks NVMe did not take at a direct reserve, those the shared tier may store:
        staged for it, and not offered to NVMe again at their put (``Writer.plan``)."""
        shared = self.shared
        staged = {key for key in keys if shared is not None and key not in shared.index}
        owner.nvme_refused |= staged
        return staged

    def _await_staging(self, needed: int) -> None:
        """While staging puts are being committed, wait (lock released, bounded) until
        ``needed`` staging slots are free: their slots come back within a batch's write, and a
        reserve answered without them would drop blocks the lower tiers should store."""
        dram = self._require().dram
        deadline = time.monotonic() + STAGING_WAIT_S
        while self._writing and dram.free_staging() < needed:
            left = deadline - time.monotonic()
            if left <= 0:
                log.warning("kvtier: no staging slots came back in %.0f s", STAGING_WAIT_S)
                return
            self._room.wait(left)

    def _assign(self, owner: Owner, key: bytes, given: dict[bytes, int | None]) -> int | None:
        if key not in given:
            return None
        slot = given.pop(key)
        if slot is None:
            slot = self._require().dram.take_slot(staging=True)
        if slot is not None:
            owner.reserved.add(slot)
        return slot

    def is_staging(self, slot: int) -> bool:
        """A staging slot: its block is written down (or dropped) at its put."""
        return self._require().dram.is_staging(slot)

    def _lower_tier_takes(self, key: bytes) -> bool:
        if self.nvme is not None and key not in self.nvme.index:
            return True
        return self.shared is not None and key not in self.shared.index

    def put(self, owner: Owner, blocks: Sequence[PutBlock], written: Sequence[tuple[int, int]] = ()) -> int:
        """:meth:`put_async`, waiting until its blocks are committed."""
        return self.put_async(owner, blocks, written).result()

    def put_async(
        self, owner: Owner, blocks: Sequence[PutBlock], written: Sequence[tuple[int, int]] = ()
    ) -> Future[int]:
        """Commit blocks the engine copied into its reserved slots; the future resolves to how
        many were kept. Checksums are of the bytes in the slots: the client's (hashed right
        after its copy, while in cache) or, where it sent none, taken here. DRAM blocks are
        committed before this returns; staging blocks' NVMe writes, and with write-through the
        DRAM blocks' too, are queued here and committed (written, synced, logged: durable) by
        the committer thread, which then frees their staging slots and resolves the future. So
        the next batch's writes queue on the device while this one is synced, the connection
        reads its next request meanwhile, and the lock is not held while the disk writes.
        ``written``: (NVMe slot, checksum) of each block the engine wrote into a slot its
        reserve gave it (``reserve_direct``), committed by the committer likewise."""
        started = time.perf_counter()
        with self._lock:
            mover = self._require()
            if self._closed:
                raise RuntimeError("sidecar stopping: put refused")
            by_engine = direct.written(owner.direct, written)
            try:
                stored, staged = self._enter(owner, blocks)
            except ValueError:  # the engine's slots are no use now: free again
                mover.writer.abandon(by_engine)
                raise
            refused = owner.nvme_refused & {key for key, _ in staged}
            owner.nvme_refused -= refused
            if self._sealer is not None:
                self._sealer.add([k for k, e in stored if e.checksum is None])
            self.metrics.written_bytes.labels("dram").inc(len(stored) * self.block_bytes)
            self.metrics.write_seconds.labels("dram").observe(time.perf_counter() - started)
            through = stored if self.config.write_mode == "write-through" else []
            count = len(stored) + len(staged) + len(by_engine)
            down = [(k, e) for k, e in staged if mover.dram.is_staging(e.slot)] + through
            plan = mover.writer.plan(down, False, refused)
            plan.engine = by_engine  # synced and logged with the sidecar's own writes
            mover.publish_usage()
            if not staged and not plan.nvme and not plan.shared and not plan.engine:
                return _done(count)
            # Written from their DRAM slots outside the lock: a slot evicted meanwhile is not
            # handed out again until the write is committed (the lease defers its return).
            leased = [e.slot for _, e in through]
            for slot in leased:
                mover.dram.lease(slot)
            mover.writer.start(plan)
            self._writing += 1
            staging = [e.slot for _, e in staged]
            return self._committer.submit(self._commit_put, mover, plan, staging, leased, count)

    def _enter(self, owner: Owner, blocks: Sequence[PutBlock]) -> tuple[list[Block], list[Block]]:
        """The blocks of a put as (key, entry): those entering DRAM (added to its index here)
        and those only passing through (staging slots, or DRAM already holding the key)."""
        dram = self._require().dram
        now = time.time()
        stored: list[Block] = []
        staged: list[Block] = []
        # A block's parent is mostly the block before it in the same put: its entries (in every
        # tier it reaches) keep that key object rather than an equal copy, 49 bytes a block.
        keys = {block.key: block.key for block in blocks}
        for block in blocks:
            if block.slot not in owner.reserved:
                raise ValueError(f"blocks: slot {block.slot} is not reserved by this connection")
            owner.reserved.discard(block.slot)
            parent = keys.get(block.parent, block.parent)
            entry = Entry(parent, self.config.priority, block.key in self._pinned, now, block.slot)
            entry.checksum = block.checksum
            if dram.is_staging(block.slot) or block.key in dram.index:
                staged.append((block.key, entry))
            else:
                dram.index.add(block.key, entry)
                dram.record(block.key, entry)  # with the client's checksum; else the sealer's
                stored.append((block.key, entry))
        return stored, staged

    def _commit_put(
        self, mover: Mover, plan: WritePlan, slots: list[int], leased: list[int], count: int
    ) -> int:
        """On the committer thread: wait for a put's queued writes, sync them and the blocks
        the engine wrote (one ``fdatasync``), then (under the lock) enter them into the lower
        tiers, free the put's staging slots and end the leases on the DRAM slots written
        through."""
        try:
            mover.writer.finish(plan)
        finally:
            with self._lock:
                mover.writer.commit(plan)
                for slot in slots:
                    mover.dram.give_back(slot)
                for slot in leased:
                    mover.dram.unlease(slot)
                self._writing -= 1
                mover.publish_usage()
                self._room.notify_all()
        return count

    # ---- connection bookkeeping ----

    def release(self, owner: Owner, slots: Sequence[int], nvme_slots: Sequence[int] = ()) -> None:
        """End ``owner``'s leases on DRAM or staging ``slots`` (a copy out ended), and on the
        ``nvme_slots`` of a ``get_direct`` (its engine's reads ended)."""
        with self._lock:
            self._unlease(owner, slots)
            nvme = self._require().nvme
            for slot in nvme_slots:
                if slot in owner.nvme_leases and nvme is not None:
                    owner.nvme_leases.remove(slot)
                    nvme.unlease(slot)

    def _unlease(self, owner: Owner, slots: Sequence[int]) -> None:
        dram = self._require().dram
        for slot in slots:
            if slot in owner.leases:
                owner.leases.remove(slot)
                dram.unlease(slot)

    def drop_owner(self, owner: Owner) -> None:
        """A connection ended: its leases end and its unfilled reservations go back."""
        with self._lock:
            if self.dram is None:
                return
            for slot in owner.leases:
                self.dram.unlease(slot)
            for slot in owner.reserved:
                self.dram.give_back(slot)
            if self._mover is not None:
                self._mover.writer.abandon(list(owner.direct.values()))
            if self.nvme is not None:
                for slot in owner.nvme_leases:
                    self.nvme.unlease(slot)
            owner.nvme_leases.clear()
            owner.nvme_refused.clear()
            self._forget_expected(owner, list(owner.expected))
            owner.leases.clear()
            owner.reserved.clear()
            owner.direct.clear()
            owner.ahead = owner.next_ask = None

    def report_corrupt(self, keys: Sequence[bytes]) -> None:
        """The client found these blocks failing their checksum: drop them from DRAM, or from
        NVMe where the client read them through a staging slot (it checks those)."""
        with self._lock:
            mover = self._require()
            for key in keys:
                if key in mover.dram.index:
                    entry = mover.dram.index.remove(key)
                    mover.dram.give_back(entry.slot)
                    self.metrics.corrupt_blocks.labels("dram").inc()
                elif mover.nvme is not None and key in mover.nvme.index:
                    mover.drop_corrupt_nvme(key)
            mover.publish_usage()

    # ---- hints ----

    def prefetch(self, keys: Sequence[bytes]) -> None:
        """Start promoting lower-tier blocks of the chain to DRAM in the background."""
        if self.dram is not None and self.dram.capacity:
            self._background.submit(self._prefetch_now, list(keys))

    def _prefetch_now(self, keys: list[bytes]) -> None:
        """Promote the chain's lower-tier blocks a run at a time, each NVMe run in one parallel
        read of at most a load's answer (``answer_blocks``), taking the lock for each run only:
        the engine's own requests go between them instead of waiting for the whole chain."""
        try:
            with self._lock:
                self._require()
                self._claim(keys)
            done = 0
            while done < len(keys):
                with self._lock:
                    done = self._prefetch_run(keys, done)
                    self._poke_demoter()
        except Exception:  # a hint must never take the sidecar down
            log.exception("kvtier: prefetch failed")

    def _prefetch_run(self, keys: list[bytes], start: int) -> int:
        """Under the lock: promote the next run of ``keys`` from ``start`` that DRAM does not
        hold; where the prefetch goes on from (``len(keys)`` once it is done or stopped)."""
        mover = self._require()

        def held(key: bytes) -> bool:  # or on its way up
            return key in mover.dram.index or key in mover.demoting or key in mover.promoting

        first = next((i for i in range(start, len(keys)) if not held(keys[i])), len(keys))
        run = list(itertools.takewhile(lambda key: not held(key), keys[first : first + self.answer_blocks]))
        if not run:
            return len(keys)
        origin = "nvme" if self.nvme is not None and run[0] in self.nvme.index else "shared"
        entries = self._promote(mover, run, keys[first - 1] if first else None, staging_ok=False)
        for key in run[: len(entries)]:
            self._remember_prefetch(key, origin)
        return first + len(entries) if entries else len(keys)

    @property
    def answer_blocks(self) -> int:
        """The most blocks one read from the lower tiers brings up at a time: half the staging
        slots for a load's answer (the other half for the answer read ahead), and as many for a
        prefetch's run."""
        return max(1, self.staging_slots // 2)

    def wait_for_hints(self) -> None:
        """Return once the hints queued so far (prefetches, write-through of blocks a read made
        admitted) were acted on: for benchmarks and tests, which time or check their effect."""
        self._background.submit(lambda: None).result()

    def _remember_prefetch(self, key: bytes, origin: str) -> None:
        self.metrics.prefetched.labels(origin).inc()
        self._prefetched_from[key] = origin
        while len(self._prefetched_from) > PREFETCH_MEMORY:
            self._prefetched_from.popitem(last=False)  # prefetched but never asked for

    def expect(self, owner: Owner, request: str, keys: Sequence[bytes]) -> None:
        """Look-ahead: a request queued at the engine will load these blocks. They are kept
        (never evicted, always admitted) until ``unexpect`` or the connection ends, and are
        moved up to DRAM now."""
        with self._lock:
            self._require()
            self._forget_expected(owner, [request])
            if owner.expected_blocks + len(keys) > MAX_EXPECTED_BLOCKS:
                self._expect_refused += 1
                self.metrics.lookahead_refused.labels(owner.source).inc()
                return
            owner.expected[request] = list(keys)
            owner.expected_blocks += len(keys)
            self._count_expected(owner.source, 1, len(keys))
            for index in self._indexes():
                index.expect(keys)
            while len(owner.expected) > MAX_EXPECTED:
                self._forget_expected(owner, [next(iter(owner.expected))])
        self.prefetch(keys)

    def unexpect(self, owner: Owner, requests: Sequence[str]) -> None:
        """Those queued requests were scheduled (their loads follow) or left."""
        with self._lock:
            self._forget_expected(owner, requests)

    def _forget_expected(self, owner: Owner, requests: Sequence[str]) -> None:
        for request in requests:
            keys = owner.expected.pop(request, None)
            if keys is not None:
                owner.expected_blocks -= len(keys)
                self._count_expected(owner.source, -1, -len(keys))
                for index in self._indexes():
                    index.unexpect(keys)

    def _count_expected(self, source: str, requests: int, blocks: int) -> None:
        self.metrics.lookahead_requests.labels(source).inc(requests)
        self.metrics.lookahead_blocks.labels(source).inc(blocks)

    def _indexes(self) -> list[TierIndex]:
        return [tier.index for tier in (self.dram, self.nvme) if tier is not None]

    def pin(self, keys: Sequence[bytes]) -> None:
        """Keep these blocks resident in DRAM from now on (also ones that arrive later)."""
        with self._lock:
            self._pinned.update(keys)
            if self.dram is not None:
                for key in keys:
                    self.dram.index.pin(key)
        self.prefetch(keys)

    # ---- housekeeping ----

    def sweep(self, now: float | None = None) -> int:
        """Drop blocks unused for longer than ``retention_s``; returns how many."""
        retention = self.config.retention_s
        if retention is None:
            return 0
        now = time.time() if now is None else now
        dropped = 0
        with self._lock:
            mover = self._require()
            for key in mover.dram.index.expired(now, retention):
                mover.dram.give_back(mover.dram.index.remove(key).slot)
                dropped += 1
            if mover.nvme is not None:
                stale = [k for k in mover.nvme.index.expired(now, retention) if isinstance(k, bytes)]
                mover.drop_nvme(stale)
                dropped += len(stale)
            mover.publish_usage()
        return dropped

    def wait_sealed(self, timeout: float) -> bool:
        """Until every DRAM block saved so far has its checksum (tests and benchmarks)."""
        return self._sealer is None or self._sealer.wait_idle(timeout)

    def wait_recovered(self, timeout: float) -> bool:
        """Until the DRAM blocks a restart found are all verified (tests and benchmarks)."""
        return self._recovery is None or self._recovery.wait_done(timeout)

    def stats(self) -> dict[str, object]:
        with self._lock:
            tiers: dict[str, object] = {}
            for name, tier in (("dram", self.dram), ("nvme", self.nvme), ("shared", self.shared)):
                if tier is not None:
                    tiers[name] = {"blocks": len(tier.index), "capacity_blocks": tier.index.capacity}
            unsealed = (
                sum(1 for k in self.dram.index if (e := self.dram.index.get(k)) and e.checksum is None)
                if self.dram
                else 0
            )
            return {
                "block_bytes": self.block_bytes,
                "tiers": tiers,
                "pinned": len(self._pinned),
                "unsealed": unsealed,
                "recovery": self._found.stats(self._recovery.pending if self._recovery else 0),
                "admission_state": dict(self._admission_state),
                "shared_janitor": _janitor_stats(self._janitor),
                "memory": self.memory.report() if self.memory else None,
                "lookahead_refused": self._expect_refused,
            }

    def close(self) -> None:
        """Stop serving: later requests get "not configured" errors, never a closed file."""
        with self._lock:
            self._closed = True  # no put is queued after this: the committer can drain
        self._committer.shutdown(wait=True)
        self._wait_preallocated()  # the keeper's last save follows
        for worker in (self._demoter, self._sealer, self._recovery, self._keeper, self._janitor):
            if worker is not None:
                worker.stop()
        self._background.shutdown(wait=True)
        with self._lock:
            while self._reading:  # a load's read in flight: its store and slots stay open until it ends
                self._promoted.wait(PROMOTION_WAIT_S)
            if self.nvme is not None:
                self.nvme.store.close()
            if self.dram is not None:
                with contextlib.suppress(BufferError):  # a request's view still alive
                    self.dram.arena.close()
                if self.dram.table is not None:
                    self.dram.table.close()
            self.dram = self.nvme = self.shared = self._mover = None


def _janitor_stats(janitor: Janitor | None) -> dict[str, object] | None:
    """Whether this sidecar is the shared volume's janitor, and its last sweep."""
    if janitor is None:
        return None
    return {"holding": janitor.holding, "last_sweep": asdict(janitor.last) if janitor.last else None}


def _done(count: int) -> Future[int]:
    """A put with nothing left to write down: already committed."""
    future: Future[int] = Future()
    future.set_result(count)
    return future


def staging_budget(asked: int, half: int) -> int:
    """How many of the ``asked`` blocks (from the first one DRAM lacks) one answer may bring
    up from the lower tiers through staging slots: ``half`` of them (the client copies one
    answer out while the next is read into the other half), and once what is asked fits in two
    such answers, half of it (at least a quarter of ``half``, and ``MIN_ANSWER``): the client
    copies the last answer out with no read left to overlap, so a short last answer ends the
    load sooner; below ``MIN_ANSWER`` blocks a round trip costs more than the copy it hides."""
    if asked <= 2 * half:
        return min(half, max(MIN_ANSWER, half // 4, -(-asked // 2)))
    return half


def _left(keys: Sequence[bytes], found: Sequence[object]) -> list[bytes] | None:
    """What an answer left of its get, when it brought some blocks but not all (the client asks
    for the rest next); None when it brought all, or none (a miss: the load ends there)."""
    return list(keys[len(found) :]) if 0 < len(found) < len(keys) else None
