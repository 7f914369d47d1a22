"""Block-level prefix hit ratio of an eviction policy on a request trace.

Drives :class:`~strata.worker.kvtier.index.TierIndex` (the sidecar's own index and policy code)
with the hash chains of a Mooncake-style trace, and computes the offline optimum (Belady:
evict the block whose next use is farthest) for comparison. A request's hits are the longest
cached prefix of its chain, as in the traces' README; afterwards all its blocks are cached.
"""

from __future__ import annotations

import heapq
import json
import math
from collections.abc import Sequence
from pathlib import Path

from strata.worker.kvtier.index import Entry, TierIndex

Trace = list[list[int]]


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


def hit_ratio(trace: Sequence[Sequence[int]], policy_name: str, capacity: int) -> float:
    """Cached-prefix blocks over all requested blocks, with the named policy."""
    if policy_name == "optimal":
        return optimal_hit_ratio(trace, capacity)
    index = TierIndex(capacity, policy_name)
    hits = total = 0
    for now, chain in enumerate(trace):
        hits += _cached_prefix(index, chain)
        total += len(chain)
        parent: int | None = None
        for key in chain:
            if key in index:
                index.touch(key, now)
            else:
                index.make_room()
                if index.has_room():
                    index.add(key, Entry(parent=parent, priority=0, pinned=False, last_used=now))
            parent = key
    return hits / total if total else 0.0


def _cached_prefix(index: TierIndex, chain: Sequence[int]) -> int:
    for position, key in enumerate(chain):
        if key not in index:
            return position
    return len(chain)


def next_uses(trace: Sequence[Sequence[int]]) -> list[list[float]]:
    """For every (request, block): the index of the next request asking for it, or inf."""
    upcoming: dict[int, float] = {}
    result: list[list[float]] = [[] for _ in trace]
    for i in range(len(trace) - 1, -1, -1):
        result[i] = [upcoming.get(key, math.inf) for key in trace[i]]
        for key in trace[i]:
            upcoming[key] = i
    return result


def optimal_hit_ratio(trace: Sequence[Sequence[int]], capacity: int) -> float:
    """Belady's offline optimum with prefix hits: evict the farthest next use; among equal next
    uses the deeper block first, since its prefix is needed for it to be of any use."""
    uses = next_uses(trace)
    cached: dict[int, tuple[float, int]] = {}
    heap: list[tuple[float, int, int]] = []  # (-next use, -position, key); stale ones skipped
    hits = total = 0
    for i, chain in enumerate(trace):
        hits += next((p for p, k in enumerate(chain) if k not in cached), len(chain))
        total += len(chain)
        for position, key in enumerate(chain):
            stamp = (uses[i][position], position)
            cached[key] = stamp
            heapq.heappush(heap, (-stamp[0], -position, key))
        while len(cached) > capacity:
            neg_use, neg_pos, key = heapq.heappop(heap)
            if cached.get(key) == (-neg_use, -neg_pos):
                del cached[key]
        if len(heap) > 4 * capacity + 4096:
            heap = [(-use, -pos, key) for key, (use, pos) in cached.items()]
            heapq.heapify(heap)
    return hits / total if total else 0.0
