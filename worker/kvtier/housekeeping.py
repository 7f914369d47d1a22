"""The sidecar's upkeep: blocks past their retention dropped (``sweep``) or found corrupt
dropped (``report_corrupt``), what the admission policies learnt saved, what it holds reported
(``stats``), and the orderly stop (``close``)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import asdict

from strata.worker.kvtier.janitor import Janitor
from strata.worker.kvtier.loads import PROMOTION_WAIT_S
from strata.worker.kvtier.state import ServiceState

PREALLOCATED_WAIT_S = 30.0  # a stop right after a start waits this long, at most, for the DRAM pages


class Housekeeping:
    def __init__(self, state: ServiceState) -> None:
        self.state = state

    def sweep(self, now: float | None = None) -> int:
        """Drop blocks unused for longer than ``retention_s``; returns how many."""
        retention = self.state.config.retention_s
        if retention is None:
            return 0
        now = time.time() if now is None else now
        dropped = 0
        with self.state.lock:
            mover = self.state.require()
            for key in mover.dram.index.expired(now, retention):
                mover.dram.give_back(mover.dram.index.remove(key).slot)
                dropped += 1
            if mover.nvme is not None:
                stale = [k for k in mover.nvme.index.expired(now, retention) if isinstance(k, bytes)]
                mover.drop_nvme(stale)
                dropped += len(stale)
            mover.publish_usage()
        return dropped

    def report_corrupt(self, keys: Sequence[bytes]) -> None:
        """The client found these blocks failing their checksum: drop them from DRAM, or from
        NVMe where the client read them through a staging slot (it checks those)."""
        with self.state.lock:
            mover = self.state.require()
            for key in keys:
                if key in mover.dram.index:
                    entry = mover.dram.index.remove(key)
                    mover.dram.give_back(entry.slot)
                    self.state.metrics.corrupt_blocks.labels("dram").inc()
                elif mover.nvme is not None and key in mover.nvme.index:
                    mover.drop_corrupt_nvme(key)
            mover.publish_usage()

    def save_admission_state(self) -> None:
        """Save what the admission policies learnt now (also every ``SAVE_EVERY_S``, and at
        ``close``)."""
        if self.state.keeper is not None:
            self._wait_preallocated()
            self.state.keeper.save()  # every place, due or not

    def _wait_preallocated(self) -> None:
        """A save asked for (or the last, at ``close``) waits, boundedly, for the DRAM tier's
        pages: until then the places beside it do not save (``Assembly._in_shm``). Only a keeper's
        saves need them: a sidecar with none stops at once."""
        if self.state.dram is not None and self.state.keeper is not None:
            self.state.dram.arena.preallocated.wait(PREALLOCATED_WAIT_S)

    def wait_sealed(self, timeout: float) -> bool:
        """Until every DRAM block saved so far has its checksum (tests and benchmarks)."""
        return self.state.sealer is None or self.state.sealer.wait_idle(timeout)

    def wait_recovered(self, timeout: float) -> bool:
        """Until the DRAM blocks a restart found are all verified (tests and benchmarks)."""
        return self.state.recovery is None or self.state.recovery.wait_done(timeout)

    def stats(self) -> dict[str, object]:
        state = self.state
        with state.lock:
            tiers: dict[str, object] = {}
            for name, tier in (("dram", state.dram), ("nvme", state.nvme), ("shared", state.shared)):
                if tier is not None:
                    tiers[name] = {"blocks": len(tier.index), "capacity_blocks": tier.index.capacity}
            unsealed = (
                sum(1 for k in state.dram.index if (e := state.dram.index.get(k)) and e.checksum is None)
                if state.dram
                else 0
            )
            return {
                "block_bytes": state.block_bytes,
                "tiers": tiers,
                "pinned": len(state.pinned),
                "unsealed": unsealed,
                "recovery": state.found.stats(state.recovery.pending if state.recovery else 0),
                "admission_state": dict(state.admission_state),
                "shared_janitor": _janitor_stats(state.janitor),
                "memory": state.memory.report() if state.memory else None,
                "lookahead_refused": state.expect_refused,
            }

    def close(self) -> None:
        """Stop serving: later requests get "not configured" errors, never a closed file."""
        state = self.state
        with state.lock:
            state.closed = True  # no put is queued after this: the committer can drain
        state.committer.shutdown(wait=True)
        self._wait_preallocated()  # the keeper's last save follows
        for worker in (
            state.demoter,
            state.sealer,
            state.recovery,
            state.keeper,
            state.janitor,
        ):
            if worker is not None:
                worker.stop()
        state.background.shutdown(wait=True)
        with state.lock:
            while state.reading:  # a load's read in flight: its store and slots stay open until it ends
                state.promoted.wait(PROMOTION_WAIT_S)
            if state.nvme is not None:
                state.nvme.store.close()
            if state.dram is not None:
                with contextlib.suppress(BufferError):  # a request's view still alive
                    state.dram.arena.close()
                if state.dram.table is not None:
                    state.dram.table.close()
            state.dram = state.nvme = state.shared = state.mover = None


def _janitor_stats(janitor: Janitor | None) -> dict[str, object] | None:
    """Whether this sidecar is the shared volume's janitor, and its last sweep."""
    if janitor is None:
        return None
    return {"holding": janitor.holding, "last_sweep": asdict(janitor.last) if janitor.last else None}
