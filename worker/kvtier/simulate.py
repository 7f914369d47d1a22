"""Block-level prefix hit ratio of the tiers' policies on a request trace.

Drives :class:`~strata.worker.kvtier.index.TierIndex` (the sidecar's own index, eviction and
admission code) with the hash chains of a Mooncake-style trace, request by request as the
sidecar sees them, and computes the offline optimum (Belady: evict the block whose next use is
farthest) for comparison. A request's hits are the longest held prefix of its chain, as in the
traces' README. Pure Python: no sockets, no torch.

Use it for one cache, or one per replica::

    cache = Cache(capacity=5000, eviction="prefix-aware", admission="adaptive")
    hits = cache.request(chain)          # blocks of the chain's held prefix
    cache.expect(queued_chain)           # look-ahead: a queued request will ask for these
    cache.unexpect(queued_chain)         # ... it was scheduled (or left)

``eviction`` is one of :data:`~strata.worker.kvtier.policy.POLICIES`, ``admission`` one of
:data:`~strata.worker.kvtier.admission.ADMISSIONS`.
"""

from __future__ import annotations

import heapq
import json
import math
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path

from strata.worker.kvtier.admission import Doorkeeper
from strata.worker.kvtier.index import Entry, TierIndex

Trace = list[list[int]]
Chain = Sequence[Hashable]


def load_trace(path: str | Path) -> Trace:
    """The ``hash_ids`` chain of every request, in order."""
    chains: Trace = []
    with open(path) as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                chains.append([int(h) for h in json.loads(line)["hash_ids"]])
            except (ValueError, KeyError, TypeError) as err:
                raise ValueError(f"{path}:{number}: hash_ids: not a list of integers ({err})") from err
    return chains


class Cache:
    """One tier under a trace, doing per request what the sidecar does for the engine's calls:
    ``get`` of the held prefix (hits), then ``reserve`` of the whole chain (held blocks are
    touched, the others offered to admission, and the admitted ones stored)."""

    def __init__(self, capacity: int, eviction: str = "prefix-aware", admission: str = "always") -> None:
        self.index = TierIndex(capacity, eviction, admission)
        self._now = 0

    def request(self, chain: Chain) -> int:
        self._now += 1
        index, now = self.index, self._now
        hits = cached_prefix(index, chain)
        for position in range(hits):
            index.record_hit(chain[position], _parent(chain, position))
            index.touch(chain[position], now)
        admitted: list[tuple[Hashable, Hashable | None]] = []
        for position, key in enumerate(chain):
            if key in index:
                index.touch(key, now)
            elif index.admits(key, _parent(chain, position)):
                admitted.append((key, _parent(chain, position)))
        index.make_room(len(admitted))
        for key, parent in admitted:
            if not index.has_room():
                break
            index.add(key, Entry(parent=parent, priority=0, pinned=False, last_used=now))
        return hits

    def expect(self, chain: Chain) -> None:
        self.index.expect(chain)

    def unexpect(self, chain: Chain) -> None:
        self.index.unexpect(chain)


def _parent(chain: Chain, position: int) -> Hashable | None:
    return chain[position - 1] if position else None


def cached_prefix(index: TierIndex, chain: Chain) -> int:
    for position, key in enumerate(chain):
        if key not in index:
            return position
    return len(chain)


def replay(trace: Sequence[Chain], cache: Cache, lookahead: int = 0) -> float:
    """Hit ratio of ``cache`` over ``trace`` in arrival order. With ``lookahead`` the next that
    many requests are queued while one is served: the cache is told what they will ask for."""
    for chain in trace[1 : lookahead + 1]:
        cache.expect(chain)
    hits = total = 0
    for i, chain in enumerate(trace):
        hits += cache.request(chain)
        total += len(chain)
        if lookahead and i + 1 < len(trace):
            cache.unexpect(trace[i + 1])  # scheduled next: no longer waiting
            if i + 1 + lookahead < len(trace):
                cache.expect(trace[i + 1 + lookahead])
    return hits / total if total else 0.0


def hit_ratio(
    trace: Sequence[Chain],
    capacity: int,
    eviction: str = "lru",
    admission: str = "always",
    lookahead: int = 0,
) -> float:
    """Cached-prefix blocks over all requested blocks, with the named policies."""
    return replay(trace, Cache(capacity, eviction, admission), lookahead)


def next_uses(trace: Sequence[Sequence[int]]) -> list[list[float]]:
    """For every (request, block): the index of the next request asking for it, or inf."""
    upcoming: dict[int, float] = {}
    result: list[list[float]] = [[] for _ in trace]
    for i in range(len(trace) - 1, -1, -1):
        result[i] = [upcoming.get(key, math.inf) for key in trace[i]]
        for key in trace[i]:
            upcoming[key] = i
    return result


def optimal_hit_ratio(
    trace: Sequence[Sequence[int]],
    capacity: int,
    doorkeeper: bool = False,
    lookahead: int = 0,
    remember_all: bool = False,
) -> float:
    """Belady's offline optimum with prefix hits: evict the farthest next use; among equal next
    uses the deeper block first, since its prefix is needed for it to be of any use.

    With ``doorkeeper`` a block enters only as the doorkeeper admission would let it (on its
    second sighting, or while the cache has room): the ceiling of every eviction order behind
    that admission rule. With ``lookahead`` too, a block one of the next ``lookahead``
    requests asks for also enters (the queue announced it). The doorkeeper's sketch forgets
    sightings older than about ``DOORKEEPER_WINDOW`` capacities; with ``remember_all`` it
    remembers every one instead (exactly): the ceiling of every policy that admits no first
    sighting blindly."""
    uses = next_uses(trace)
    seen = _seen_before(capacity, remember_all) if doorkeeper else None
    cached: dict[int, tuple[float, int]] = {}
    heap: list[tuple[float, int, int]] = []  # (-next use, -position, key); stale ones skipped
    hits = total = 0
    for i, chain in enumerate(trace):
        hits += next((p for p, k in enumerate(chain) if k not in cached), len(chain))
        total += len(chain)
        for position, key in enumerate(chain):
            admitted = seen is None or seen(key) or len(cached) < capacity
            if admitted or key in cached or uses[i][position] - i <= lookahead:
                cached[key] = stamp = (uses[i][position], position)
                heapq.heappush(heap, (-stamp[0], -position, key))
        heap = _evict_farthest(cached, heap, capacity)
    return hits / total if total else 0.0


def _seen_before(capacity: int, remember_all: bool) -> Callable[[int], bool]:
    """Whether a block was seen before, counting this sighting: by the doorkeeper's sketch, or
    by a set of every block seen."""
    if not remember_all:
        sketch = Doorkeeper(capacity).sketch
        return lambda key: sketch.increment(key) > 0
    seen: set[int] = set()

    def remembered(key: int) -> bool:
        before = key in seen
        seen.add(key)
        return before

    return remembered


def _evict_farthest(
    cached: dict[int, tuple[float, int]], heap: list[tuple[float, int, int]], capacity: int
) -> list[tuple[float, int, int]]:
    """Drop the farthest next uses until ``capacity`` fit; returns the heap, rebuilt when stale
    entries outnumber live ones."""
    while len(cached) > capacity:
        neg_use, neg_pos, key = heapq.heappop(heap)
        if cached.get(key) == (-neg_use, -neg_pos):
            del cached[key]
    if len(heap) > 4 * capacity + 4096:
        heap = [(-use, -pos, key) for key, (use, pos) in cached.items()]
        heapq.heapify(heap)
    return heap
