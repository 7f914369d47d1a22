"""What each engine connection holds, and what it asks the tiers to keep.

An ``Owner`` is one connection's leases (slots being read), reservations (slots being written),
NVMe slots its engine reads or writes itself, and the queued requests it announced. Leases end
at ``release``, everything at ``drop_owner``, whatever state the client died in. Pins and the
look-ahead (``expect``) keep blocks resident and move them up to DRAM (a prefetch).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from strata.common.kvbudget import MAX_EXPECTED, MAX_EXPECTED_BLOCKS
from strata.worker.kvtier.nvme import Record
from strata.worker.kvtier.state import ServiceState


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


def unlease(state: ServiceState, owner: Owner, slots: Sequence[int]) -> None:
    """End ``owner``'s leases on these DRAM or staging slots."""
    dram = state.require().dram
    for slot in slots:
        if slot in owner.leases:
            owner.leases.remove(slot)
            dram.unlease(slot)


class Leases:
    def __init__(self, state: ServiceState, prefetch: Callable[[Sequence[bytes]], None]) -> None:
        self.state, self.prefetch = state, prefetch  # ``prefetch``: moves blocks up to DRAM

    def release(self, owner: Owner, slots: Sequence[int], nvme_slots: Sequence[int] = ()) -> None:
        """End ``owner``'s leases on DRAM or staging ``slots`` (a copy out ended), and on the
        ``nvme_slots`` of a ``get_direct`` (its engine's reads ended)."""
        with self.state.lock:
            unlease(self.state, owner, slots)
            nvme = self.state.require().nvme
            for slot in nvme_slots:
                if slot in owner.nvme_leases and nvme is not None:
                    owner.nvme_leases.remove(slot)
                    nvme.unlease(slot)

    def drop_owner(self, owner: Owner) -> None:
        """A connection ended: its leases end and its unfilled reservations go back."""
        state = self.state
        with state.lock:
            if state.dram is None:
                return
            for slot in owner.leases:
                state.dram.unlease(slot)
            for slot in owner.reserved:
                state.dram.give_back(slot)
            if state.mover is not None:
                state.mover.writer.abandon(list(owner.direct.values()))
            if state.nvme is not None:
                for slot in owner.nvme_leases:
                    state.nvme.unlease(slot)
            owner.nvme_leases.clear()
            owner.nvme_refused.clear()
            self._forget_expected(owner, list(owner.expected))
            owner.leases.clear()
            owner.reserved.clear()
            owner.direct.clear()
            owner.ahead = owner.next_ask = None

    def expect(self, owner: Owner, request: str, keys: Sequence[bytes]) -> None:
        """Look-ahead: a request queued at the engine will load these blocks. They are kept
        (never evicted, always admitted) until ``unexpect`` or the connection ends, and are
        moved up to DRAM now."""
        state = self.state
        with state.lock:
            state.require()
            self._forget_expected(owner, [request])
            if owner.expected_blocks + len(keys) > MAX_EXPECTED_BLOCKS:
                state.expect_refused += 1
                state.metrics.lookahead_refused.labels(owner.source).inc()
                return
            owner.expected[request] = list(keys)
            owner.expected_blocks += len(keys)
            self._count_expected(owner.source, 1, len(keys))
            for index in state.indexes():
                index.expect(keys)
            while len(owner.expected) > MAX_EXPECTED:
                self._forget_expected(owner, [next(iter(owner.expected))])
        self.prefetch(keys)

    def unexpect(self, owner: Owner, requests: Sequence[str]) -> None:
        """Those queued requests were scheduled (their loads follow) or left."""
        with self.state.lock:
            self._forget_expected(owner, requests)

    def _forget_expected(self, owner: Owner, requests: Sequence[str]) -> None:
        for request in requests:
            keys = owner.expected.pop(request, None)
            if keys is not None:
                owner.expected_blocks -= len(keys)
                self._count_expected(owner.source, -1, -len(keys))
                for index in self.state.indexes():
                    index.unexpect(keys)

    def _count_expected(self, source: str, requests: int, blocks: int) -> None:
        self.state.metrics.lookahead_requests.labels(source).inc(requests)
        self.state.metrics.lookahead_blocks.labels(source).inc(blocks)

    def pin(self, keys: Sequence[bytes]) -> None:
        """Keep these blocks resident in DRAM from now on (also ones that arrive later)."""
        state = self.state
        with state.lock:
            state.pinned.update(keys)
            if state.dram is not None:
                for key in keys:
                    state.dram.index.pin(key)
        self.prefetch(keys)
