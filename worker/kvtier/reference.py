"""Reference implementations of the peers' cache policies, for the hit-ratio table only.

Each replays a trace (hits: the longest held prefix of each request, then every block of the
request is accessed in chain order) and reproduces the traces README's reference figures, so
that the table compares Strata's policies with the peers' as they are, not as we would like
them to be. Not used by the sidecar.

- ``tail-first``: LRU where a request's blocks are re-queued chain end first (vLLM frees a
  finished request's blocks in reverse, so its tail is evicted before its head).
- ``lfu``: least frequently used, counts kept for every block ever seen, LRU among equals.
- ``s3-fifo``: a small FIFO (10%) for new blocks, a main FIFO (90%) with reinsertion of blocks
  used again (counts capped at 3), and a ghost FIFO (as large as the main one) of blocks the
  small one evicted unused: a ghost that comes back goes straight to the main FIFO.
"""

from __future__ import annotations

import heapq
from collections import Counter, OrderedDict
from collections.abc import Callable, Container, Sequence

Trace = Sequence[Sequence[int]]


def _held_prefix(held: Container[int], chain: Sequence[int]) -> int:
    for position, key in enumerate(chain):
        if key not in held:
            return position
    return len(chain)


def tail_first(trace: Trace, capacity: int) -> float:
    lru: OrderedDict[int, None] = OrderedDict()
    hits = total = 0
    for chain in trace:
        hits += _held_prefix(lru, chain)
        total += len(chain)
        for key in reversed(chain):
            if key in lru:
                lru.move_to_end(key)
                continue
            if len(lru) >= capacity:
                lru.popitem(last=False)
            lru[key] = None
    return hits / total if total else 0.0


def lfu(trace: Trace, capacity: int) -> float:
    seen: Counter[int] = Counter()  # every sighting ever ("perfect" LFU)
    held: dict[int, tuple[int, int]] = {}  # key -> (count, last use) as pushed on the heap
    heap: list[tuple[int, int, int]] = []  # stale entries are skipped when popped
    hits = total = tick = 0
    for chain in trace:
        hits += _held_prefix(held, chain)
        total += len(chain)
        for key in chain:
            tick += 1
            seen[key] += 1
            if key not in held:
                while len(held) >= capacity:
                    count, used, victim = heapq.heappop(heap)
                    if held.get(victim) == (count, used):
                        del held[victim]
            held[key] = (seen[key], tick)
            heapq.heappush(heap, (seen[key], tick, key))
        if len(heap) > 4 * capacity + 4096:
            heap = [(count, used, key) for key, (count, used) in held.items()]
            heapq.heapify(heap)
    return hits / total if total else 0.0


class S3Fifo:
    def __init__(self, capacity: int) -> None:
        self.small_capacity = max(1, capacity // 10)
        self.main_capacity = capacity - self.small_capacity
        self.small: OrderedDict[int, None] = OrderedDict()
        self.main: OrderedDict[int, None] = OrderedDict()
        self.ghost: OrderedDict[int, None] = OrderedDict()
        self.freq: dict[int, int] = {}

    def __contains__(self, key: object) -> bool:
        return key in self.small or key in self.main

    def access(self, key: int) -> None:
        if key in self:
            self.freq[key] = min(self.freq[key] + 1, 3)
        elif key in self.ghost:
            del self.ghost[key]
            if len(self.main) >= self.main_capacity:
                self._evict_main()
            self._insert(self.main, key)
        else:
            if len(self.small) >= self.small_capacity:
                self._evict_small()
            while len(self.small) + len(self.main) >= self.small_capacity + self.main_capacity:
                self._evict_main()
            self._insert(self.small, key)

    def _insert(self, queue: OrderedDict[int, None], key: int) -> None:
        queue[key] = None
        self.freq[key] = 0

    def _evict_small(self) -> None:
        while self.small:
            key, _ = self.small.popitem(last=False)
            if self.freq[key] > 0:  # used again while small: promoted
                self.freq[key] = 0
                self.main[key] = None
                if len(self.main) > self.main_capacity:
                    self._evict_main()
                continue
            del self.freq[key]
            self.ghost[key] = None
            if len(self.ghost) > self.main_capacity:
                self.ghost.popitem(last=False)
            return

    def _evict_main(self) -> None:
        while self.main:
            key, _ = self.main.popitem(last=False)
            if self.freq[key] > 0:  # used again: reinserted with one use less
                self.freq[key] -= 1
                self.main[key] = None
                continue
            del self.freq[key]
            return


def s3_fifo(trace: Trace, capacity: int) -> float:
    cache = S3Fifo(capacity)
    hits = total = 0
    for chain in trace:
        hits += _held_prefix(cache, chain)
        total += len(chain)
        for key in chain:
            cache.access(key)
    return hits / total if total else 0.0


PEERS: dict[str, Callable[[Trace, int], float]] = {
    "tail-first": tail_first,
    "lfu": lfu,
    "s3-fifo": s3_fifo,
}
