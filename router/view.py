"""Where an endpoint's blocks are, as the router knows it.

Two sources report for each endpoint: the worker (HBM) and its KV-tier sidecar (DRAM, NVMe,
shared), each over its block-event stream. While a source's stream is synced its report is exact;
while it is down, the router falls back to its own record of which prompts it sent there (the
blocks of recent prompts, most recent kept), counted as cached in HBM. The record also covers the
last few seconds while streams are synced: a prompt sent a moment ago is cached by the time its
answer is back, but its stored events may still be on the wire. Shared-tier blocks sit on one
volume all replicas read, so what any sidecar wrote to it counts for every endpoint.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Hashable, Iterable, Sequence

from strata.common.tiers import LOCAL_TIERS, LOWER_TIERS, TIERS, Tier
from strata.worker.block_events import Event

SOURCES = ("worker", "sidecar")
FRESH_S = 5.0  # record entries this young count even while the streams are synced
SOURCE_TIERS: dict[str, tuple[Tier, ...]] = {"worker": ("hbm",), "sidecar": LOWER_TIERS}


class SharedPool:
    """Shared-tier blocks, counted by how many sidecars reported them."""

    def __init__(self) -> None:
        self._count: Counter[bytes] = Counter()

    def __contains__(self, key: object) -> bool:
        return key in self._count

    def add(self, keys: Iterable[bytes]) -> None:
        self._count.update(keys)

    def discard(self, keys: Iterable[bytes]) -> None:
        for key in keys:
            left = self._count[key] - 1
            if left > 0:
                self._count[key] = left
            else:
                del self._count[key]


class FollowBudget:
    """How many block keys all endpoints' views hold together, of the lower tiers (DRAM, NVMe,
    shared) and in the router's own records, at most ``limit`` (None: no bound). 32 replicas of
    an 8B model on the premium tier's largest sizes report 19M lower-tier keys, 1.7 GB, and 32
    full records of 100,000 blocks take 0.5 GB. Past the limit a new lower-tier key is not
    followed (a lookup misses it: the router undervalues that replica a little) and a record
    keeps fewer blocks, instead of the router outgrowing its memory. HBM keys are few and
    always followed."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = limit
        self.followed = 0  # lower-tier keys held by the views
        self.recorded = 0  # entries of the routed-block records
        self.refused = 0  # lower-tier keys not followed, in all

    @property
    def used(self) -> int:
        return self.followed + self.recorded

    @property
    def full(self) -> bool:
        return self.limit is not None and self.used >= self.limit

    def take(self, wanted: int) -> int:
        """How many of ``wanted`` more lower-tier keys may be followed (counted as held now)."""
        granted = wanted if self.limit is None else max(0, min(wanted, self.limit - self.used))
        self.followed += granted
        self.refused += wanted - granted
        return granted

    def give(self, count: int) -> None:
        self.followed -= count

    def record(self, change: int) -> None:
        """A record grew (or shrank) by ``change`` entries; it grows only while not ``full``."""
        self.recorded += change


class BlockView:
    def __init__(self, shared: SharedPool, record_blocks: int, budget: FollowBudget | None = None) -> None:
        self.shared = shared
        self.budget = budget or FollowBudget()
        self.held: dict[str, set[bytes]] = {t: set() for t in TIERS}
        self.synced = dict.fromkeys(SOURCES, False)
        self._syncing: dict[str, bool] = dict.fromkeys(SOURCES, False)
        self.record: OrderedDict[Hashable, float] = OrderedDict()  # block -> when routed
        self.record_blocks = record_blocks

    # ---- the streams ----

    def apply(self, source: str, event: Event) -> None:
        if event.kind == "snapshot":
            if not self._syncing[source]:
                self.reset(source)
                self._syncing[source] = True
            self._store(event.tier, event.blocks)
        elif event.kind == "synced":
            if not self._syncing[source]:  # an empty snapshot: nothing held
                self.reset(source)
            self._syncing[source] = False
            self.synced[source] = True
        elif event.kind == "stored":
            self._store(event.tier, event.blocks)
        elif event.kind == "removed":
            self._remove(event.tier, event.blocks)

    def reset(self, source: str) -> None:
        """The source's stream went down (or restarts): forget what it reported."""
        self.synced[source] = self._syncing[source] = False
        for tier in SOURCE_TIERS[source]:
            if tier == "shared":
                self.shared.discard(self.held[tier])
            if tier != "hbm":
                self.budget.give(len(self.held[tier]))
            self.held[tier].clear()

    def _store(self, tier: str, blocks: Sequence[bytes]) -> None:
        fresh = [b for b in blocks if b not in self.held[tier]]
        if tier != "hbm":
            fresh = fresh[: self.budget.take(len(fresh))]
        self.held[tier].update(fresh)
        if tier == "shared":
            self.shared.add(fresh)

    def _remove(self, tier: str, blocks: Sequence[bytes]) -> None:
        gone = [b for b in blocks if b in self.held[tier]]
        self.held[tier].difference_update(gone)
        if tier != "hbm":
            self.budget.give(len(gone))
        if tier == "shared":
            self.shared.discard(gone)

    # ---- the router's own record ----

    def routed(self, blocks: Sequence[Hashable], now: float) -> None:
        """The router sent ``blocks`` here: remembered, the most recent ``record_blocks`` of
        them, fewer when the budget is spent (a new one then takes the oldest one's place)."""
        for key in blocks:
            if key not in self.record:
                if not self.budget.full:
                    self.budget.record(1)
                elif self.record:
                    self.record.popitem(last=False)  # the oldest gives its place
                else:
                    return
            self.record[key] = now
            self.record.move_to_end(key)
        while len(self.record) > self.record_blocks:
            self.record.popitem(last=False)
            self.budget.record(-1)

    def forget(self) -> None:
        """The endpoint is gone: what its view held goes back to the budget."""
        for source in SOURCES:
            self.reset(source)
        self.budget.record(-len(self.record))
        self.record.clear()

    # ---- the lookup choose() calls ----

    def lookup(self, blocks: Sequence[Hashable], now: float) -> list[Tier]:
        """Tiers of the longest run of leading ``blocks`` this endpoint holds."""
        since = float("-inf") if not all(self.synced.values()) else now - FRESH_S
        found: list[Tier] = []
        for key in blocks:
            tier = self._tier_of(key, since)
            if tier is None:
                break
            found.append(tier)
        return found

    def _tier_of(self, key: Hashable, since: float) -> Tier | None:
        for tier in LOCAL_TIERS:
            if key in self.held[tier]:
                return tier
        if key in self.shared:
            return "shared"
        routed = self.record.get(key)
        if routed is not None and routed >= since:
            return "hbm"
        return None
