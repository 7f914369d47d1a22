"""Which tier holds a block (``lookup``), and blocks moved up to DRAM before they are asked
for (``prefetch``): a lookup reports the tier a prefetch brought a block from, so the per-tier
hit metrics credit NVMe and shared even when the prefetch won the race."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence

from strata.worker.kvtier.loads import Loads
from strata.worker.kvtier.state import ServiceState

log = logging.getLogger(__name__)
PREFETCH_MEMORY = 1 << 16  # origins remembered for prefetched blocks not yet looked up


class Lookup:
    def __init__(self, state: ServiceState, loads: Loads) -> None:
        self.state, self.loads = state, loads

    def lookup(self, keys: Sequence[bytes]) -> list[str]:
        with self.state.lock:
            self.state.claim(keys)
            found: list[str] = []
            for key in keys:
                tier = self._where(key)
                if tier is None:
                    break
                found.append(tier)
            return found

    def _where(self, key: bytes) -> str | None:
        state = self.state
        m = state.metrics
        if state.dram is not None and (key in state.dram.index or key in state.require().demoting):
            origin = state.prefetched_from.pop(key, None)
            if origin is not None:
                m.prefetch_used.labels(origin).inc()
            tier = origin or "dram"
            m.hits.labels(tier).inc()
            return tier
        m.misses.labels("dram").inc()
        if state.nvme is not None and key in state.nvme.index:
            m.hits.labels("nvme").inc()
            return "nvme"
        m.misses.labels("nvme").inc()
        if state.shared is not None and state.shared.contains(key):
            m.hits.labels("shared").inc()
            return "shared"
        m.misses.labels("shared").inc()
        return None

    def prefetch(self, keys: Sequence[bytes]) -> None:
        """Start promoting lower-tier blocks of the chain to DRAM in the background."""
        if self.state.dram is not None and self.state.dram.capacity:
            self.state.background.submit(self._prefetch_now, list(keys))

    def _prefetch_now(self, keys: list[bytes]) -> None:
        """Promote the chain's lower-tier blocks a run at a time, each NVMe run in one parallel
        read of at most a load's answer (``answer_blocks``), taking the lock for each run only:
        the engine's own requests go between them instead of waiting for the whole chain."""
        state = self.state
        try:
            with state.lock:
                state.require()
                state.claim(keys)
            done = 0
            while done < len(keys):
                with state.lock:
                    done = self._prefetch_run(keys, done)
                    state.poke_demoter()
        except Exception:  # a hint must never take the sidecar down
            log.exception("kvtier: prefetch failed")

    def _prefetch_run(self, keys: list[bytes], start: int) -> int:
        """Under the lock: promote the next run of ``keys`` from ``start`` that DRAM does not
        hold; where the prefetch goes on from (``len(keys)`` once it is done or stopped)."""
        state = self.state
        mover = state.require()

        def held(key: bytes) -> bool:  # or on its way up
            return key in mover.dram.index or key in mover.demoting or key in mover.promoting

        first = next((i for i in range(start, len(keys)) if not held(keys[i])), len(keys))
        run = list(itertools.takewhile(lambda key: not held(key), keys[first : first + state.answer_blocks]))
        if not run:
            return len(keys)
        origin = "nvme" if state.nvme is not None and run[0] in state.nvme.index else "shared"
        entries = self.loads.promote(mover, run, keys[first - 1] if first else None, staging_ok=False)
        for key in run[: len(entries)]:
            self._remember_prefetch(key, origin)
        return first + len(entries) if entries else len(keys)

    def wait_for_hints(self) -> None:
        """Return once the hints queued so far (prefetches, write-through of blocks a read made
        admitted) were acted on: for benchmarks and tests, which time or check their effect."""
        self.state.background.submit(lambda: None).result()

    def _remember_prefetch(self, key: bytes, origin: str) -> None:
        state = self.state
        state.metrics.prefetched.labels(origin).inc()
        state.prefetched_from[key] = origin
        while len(state.prefetched_from) > PREFETCH_MEMORY:
            state.prefetched_from.popitem(last=False)  # prefetched but never asked for
