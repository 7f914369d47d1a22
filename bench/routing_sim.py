"""The simulated half of the routing benchmark: a Mooncake trace replayed through N replicas.

Each replica's cache is the sidecar's own :class:`~strata.worker.kvtier.index.TierIndex` with its
default ``prefix-aware`` eviction, holding ``capacity`` 512-token blocks. Hits are the longest
cached prefix of a request's chain, as in the traces' README; afterwards the replica holds all of
the request's blocks. The ``strata`` and the ``least-load``/``prefix-only`` policies go through the
router's real choice function (``strata.router.choose``); ``random`` and ``round-robin`` need none.

Load, as the router knows it without asking anyone: the prefill tokens it sent each replica,
decayed with a 30 s time constant (``strata.router.load``); the simulation has no queues, so no
pending tokens. Load imbalance: per one-minute window, the most prefill tokens
any replica computed over the mean across replicas; reported as the 95th percentile over the
windows (the trace's last, partial window left out).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from strata.common.tiers import Tier
from strata.router.choose import Candidate, Policy, Prompt, choose
from strata.router.load import DecayedTokens
from strata.worker.kvtier.index import Entry, TierIndex

BLOCK_TOKENS = 512  # the traces' block size
WINDOW_S = 60.0
EVICTION = "prefix-aware"  # the sidecar's default DRAM eviction


@dataclass(frozen=True)
class Request:
    t_s: float
    tokens: int
    blocks: tuple[int, ...]


def load_requests(path: str | Path) -> list[Request]:
    """Timestamp (ms in the file), input length and block chain of every request, in order."""
    out: list[Request] = []
    with open(path) as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                out.append(Request(row["timestamp"] / 1000, int(row["input_length"]), tuple(row["hash_ids"])))
            except (ValueError, KeyError, TypeError) as err:
                raise ValueError(f"{path}:{number}: not a trace record ({err})") from err
    return out


@dataclass
class Replica:
    cache: TierIndex
    sent: DecayedTokens = field(default_factory=DecayedTokens)  # the router's record of load

    def lookup(self, blocks: Sequence[object]) -> list[Tier]:
        held: list[Tier] = []
        for key in blocks:
            if key not in self.cache:
                break
            held.append("hbm")
        return held

    def serve(self, request: Request, now: float) -> int:
        """Cache the request's chain; returns its hit blocks (the cached prefix before)."""
        hits = len(self.lookup(request.blocks))
        parent: int | None = None
        for key in request.blocks:
            if key in self.cache:
                self.cache.touch(key, now)
            else:
                self.cache.make_room()
                if self.cache.has_room():
                    self.cache.add(key, Entry(parent=parent, priority=0, pinned=False, last_used=now))
            parent = key
        self.sent.add(max(0, request.tokens - hits * BLOCK_TOKENS), now)
        return hits


PREFIX_ONLY = Policy(pending_weight=0.0, balance_weight=0.0, load_bound=None)
Picker = Callable[[Request, list[Replica], float], int]


def chooser(policy: Policy, seed: int) -> Picker:
    rng = random.Random(seed)

    def pick(request: Request, fleet: list[Replica], now: float) -> int:
        prompt = Prompt(request.blocks, request.tokens, BLOCK_TOKENS)
        candidates = [
            Candidate(str(i), r.lookup, recent_tokens=r.sent.value(now)) for i, r in enumerate(fleet)
        ]
        return int(choose(prompt, candidates, policy, rng).order[0])

    return pick


def random_picker(seed: int) -> Picker:
    rng = random.Random(seed)
    return lambda request, replicas, now: rng.randrange(len(replicas))


def round_robin() -> Picker:
    counter = iter(range(1 << 62))
    return lambda request, replicas, now: next(counter) % len(replicas)


def pickers(strata: Policy, seed: int = 0) -> dict[str, Callable[[], Picker]]:
    """Every policy of the benchmark, each a fresh picker per run."""
    return {
        "random": lambda: random_picker(seed),
        "round-robin": round_robin,
        "least-load": lambda: chooser(Policy(use_cache=False, load_bound=None), seed),
        "prefix-only": lambda: chooser(PREFIX_ONLY, seed),
        "strata": lambda: chooser(strata, seed),
    }


@dataclass
class Tally:
    hits: int = 0
    blocks: int = 0
    windows: dict[int, list[float]] = field(default_factory=dict)

    def add(self, replica: int, replicas: int, hits: int, request: Request, computed: int) -> None:
        self.hits += hits
        self.blocks += len(request.blocks)
        window = self.windows.setdefault(int(request.t_s // WINDOW_S), [0.0] * replicas)
        window[replica] += computed

    def result(self) -> dict[str, float]:
        """The last window is left out: the trace ends inside it, so it holds a few requests."""
        whole = [w for k, w in self.windows.items() if k != max(self.windows)]
        ratios = sorted(max(w) / (sum(w) / len(w)) for w in whole if sum(w) > 0)
        p95 = ratios[min(len(ratios) - 1, math.ceil(0.95 * len(ratios)) - 1)] if ratios else 1.0
        return {"hit_ratio": round(self.hits / max(1, self.blocks), 4), "imbalance_p95": round(p95, 3)}


def replay(requests: Sequence[Request], replicas: int, capacity: int, pick: Picker) -> dict[str, float]:
    fleet = [Replica(TierIndex(capacity, EVICTION)) for _ in range(replicas)]
    tally = Tally()
    for request in requests:
        now = request.t_s
        i = pick(request, fleet, now)
        hits = fleet[i].serve(request, now)
        tally.add(i, replicas, hits, request, max(0, request.tokens - hits * BLOCK_TOKENS))
    return tally.result()
