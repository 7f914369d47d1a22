"""Blocks out to the engine (``get``): leased in shared memory, DRAM's as they are, the lower
tiers' read up through staging slots first (``promote``), each answer at most half the staging
slots so that the next is read (``read_ahead``) while the client copies this one out. A block
is served only after its checksum matched, here or by the reading client along its copy out.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from strata.worker.kvtier import promotion
from strata.worker.kvtier.index import Entry
from strata.worker.kvtier.leases import Owner, ReadAhead, unlease
from strata.worker.kvtier.movement import Mover
from strata.worker.kvtier.state import ServiceState

log = logging.getLogger(__name__)
PROMOTION_WAIT_S = 1.0  # how long a wait for another promotion's read sleeps before it looks again
MIN_ANSWER = 8  # blocks: a load's answers from the lower tiers are not cut shorter than this


class Loads:
    def __init__(self, state: ServiceState) -> None:
        self.state = state

    def get(self, owner: Owner, keys: Sequence[bytes]) -> list[tuple[int, int | None]]:
        """(slot, checksum) of the leading blocks now in shared memory, leased to ``owner``:
        all DRAM holds, and from the lower tiers at most half the staging slots, so that the
        client's next ask can be read while it copies this answer out. The checksum is None
        where the client has nothing to check (see ``_to_verify``). An answer read ahead
        (``read_ahead``) for exactly these keys is handed over as it is, unless it found no
        room then (all staging slots leased): then it is read now."""
        with self.state.lock:
            ahead, owner.ahead = owner.ahead, None
            if ahead is not None and ahead.found and ahead.asked == list(keys):
                owner.next_ask = ahead.next_ask
                return ahead.found
            if ahead is not None:
                unlease(self.state, owner, [slot for slot, _ in ahead.found])
            found = self._get(owner, keys)
            owner.next_ask = _left(keys, found)
            return found

    def read_ahead(self, owner: Owner) -> None:
        """Read the answer to what the last answer left of its get (``next_ask``) now, before
        the client asks: its disk reads overlap the client's copy of the answer just sent,
        instead of waiting for the next get's round trip. Held for the owner until its next get
        (handed over when it asks for exactly that), or given back (``drop_ahead``)."""
        try:
            with self.state.lock:
                asked, owner.next_ask = owner.next_ask, None
                if asked and owner.ahead is None and self.state.mover is not None:
                    found = self._get(owner, asked)
                    owner.ahead = ReadAhead(asked, found, _left(asked, found))
        except Exception:  # unasked work must never take the connection down: the get reads
            log.exception("kvtier: read-ahead failed")

    def drop_ahead(self, owner: Owner) -> None:
        """The client went on to something else: an answer read ahead goes back unread."""
        with self.state.lock:
            ahead, owner.ahead, owner.next_ask = owner.ahead, None, None
            if ahead is not None and self.state.mover is not None:
                unlease(self.state, owner, [slot for slot, _ in ahead.found])

    def _get(self, owner: Owner, keys: Sequence[bytes]) -> list[tuple[int, int | None]]:
        """``get`` under the lock."""
        state = self.state
        mover = state.require()
        dram = mover.dram
        now = time.time()
        out: list[tuple[int, int | None]] = []
        state.claim(keys)
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
                mover = state.require()
                continue
            fresh = entry is None
            if entry is not None:
                dram.index.record_hit(keys[i], parent)
                dram.index.touch(keys[i], now)  # no-op for a demoting block
                dram.used(entry)  # and in the slot table, for a restart
                entries = [entry]
            else:
                if budget is None:
                    budget = staging_budget(len(keys) - i, state.answer_blocks)
                room = budget - staged
                entries = self.promote(mover, keys[i : i + room], parent, True) if room > 0 else []
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
        state.poke_demoter()
        if state.config.write_mode == "write-through" and state.nvme is not None and out:
            state.background.submit(self._write_through_admitted, list(keys[: len(out)]))
        return out

    def _wait_for_read(self, mover: Mover, key: bytes, waited: set[bytes]) -> None:
        """Wait (lock released) for the read bringing ``key`` up to commit, or a while."""
        if key not in waited:
            waited.add(key)
            self.state.metrics.read_waits.labels(mover.promoting[key]).inc()
        self.state.promoted.wait(PROMOTION_WAIT_S)

    def promote(
        self, mover: Mover, keys: Sequence[bytes], parent: bytes | None, staging_ok: bool
    ) -> list[Entry]:
        """Bring the leading blocks of ``keys`` up from a lower tier (``Mover.plan_promotion``),
        planned and committed under the lock, which is released while the blocks are read: the
        engine's lookups and saves, other loads and the background workers go on meanwhile.
        Called with the lock held once (``get``, ``read_ahead``, a prefetch's run); the state
        the caller read before may have changed when this returns."""
        state = self.state
        if state.closed:
            return []
        plan = mover.plan_promotion(keys, parent, staging_ok)
        if plan is None:
            return []
        state.reading += 1
        state.lock.release()
        try:
            promotion.read(plan, mover.dram, mover.nvme, mover.shared)
        finally:
            state.lock.acquire()
            state.reading -= 1
            entries = mover.commit_promotion(plan)
            state.promoted.notify_all()
        return entries

    def _to_verify(self, entry: Entry, fresh: bool) -> int | None:
        """The checksum the client checks its copy against; None when there is nothing to check:
        read from a lower tier into a DRAM slot just now (verified here), not sealed yet, or
        DRAM reads are not verified (``dram.verify_reads``). A block read into a staging slot
        is the client's to check (``Mover.client_checks``)."""
        if fresh and not self.state.require().client_checks([entry.slot]):
            return None
        return entry.checksum if self.state.config.dram.verify_reads else None

    def _write_through_admitted(self, keys: list[bytes]) -> None:
        """Write-through with NVMe admission: a block refused at its first put is written down
        once a later read makes it admitted, in the background, off the engine's load path."""
        try:
            with self.state.lock:
                mover = self.state.require()
                dram = mover.dram
                resident = [(k, e) for k in keys if (e := dram.index.get(k)) and not dram.is_staging(e.slot)]
                mover.write_down(resident, demoting=False)
                mover.publish_usage()
        except Exception:  # a background copy must never take the sidecar down
            log.exception("kvtier: write-through of admitted blocks failed")


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
