"""Which replica serves a request: the router's one decision, as a pure function.

``choose(prompt, candidates, policy, rng)`` ranks the candidate endpoints for one request and
returns them best first (the fallback order). It reads nothing but its arguments and writes
nothing, so the router, the routing benchmark and the fleet simulator (``strata sim``) all call
the same code with plain data.

For each candidate the cost is an estimate, in prefill-token units, of the work standing between
the request and its first token on that endpoint, plus a balancing term:

    cost = sum over the prompt's cached leading blocks of block_size * weight(tier holding it)
         + tokens past the cached prefix (computed: weight 1)
         + pending_weight * prefill tokens queued or running there (computed before ours)
         + balance_weight * prefill tokens recently sent there (decayed; spreads the load)

Only the longest run of *leading* blocks an endpoint holds counts (a block is useless without its
prefix), and never the block holding the prompt's last token (its logits must be computed), as in
the worker's own prefix cache. Tier weights are the cost of bringing a block's KV in from that tier
relative to recomputing it (``strata.router.weights``).

Two guards keep the cheapest-cache choice from hurting the fleet; a candidate failing one is
ranked after every candidate that passes both (it stays in the fallback list):

- bounded load: an endpoint whose load (pending plus recent tokens) exceeds ``load_bound`` times
  the mean load including this request's tokens (the "consistent hashing with bounded loads"
  rule), so one hot shared prefix (a system prompt everyone sends) cannot pile all traffic onto
  the replica holding it;
- a full KV cache (``kv_usage >= kv_full``): the request would wait for blocks there.

Lowest cost wins; exact ties are broken at random with ``rng``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from strata.common.tiers import Tier
from strata.router.weights import DEFAULT_WEIGHTS, TierWeights

BlockKey = Hashable  # bytes (chained block hashes) in the router; trace ids in simulations
Lookup = Callable[[Sequence[BlockKey]], Sequence[Tier]]
Reason = Literal["cache", "load", "guard", "random", "only"]


@dataclass(frozen=True)
class Prompt:
    """One request as the router sees it: the chained hashes of its full blocks (in order, as
    ``strata.worker.kv_connector.chain_hashes`` computes them) and its total token count."""

    blocks: Sequence[BlockKey]
    tokens: int
    block_size: int

    @property
    def usable_blocks(self) -> int:
        """Leading blocks a cache may serve: all but the one holding the last token."""
        return min(len(self.blocks), max(0, (self.tokens - 1) // self.block_size))


@dataclass(frozen=True)
class Candidate:
    """An endpoint that may take the request.

    ``lookup(blocks)`` returns the tiers holding the longest run of leading ``blocks`` on that
    endpoint (stopping at the first miss), with the semantics of ``KVConnector.lookup`` plus
    ``"hbm"``. ``pending_tokens``: prefill tokens queued or running there that would run before
    this request (the router counts what the worker reports beyond one engine step);
    ``recent_tokens``: prefill tokens recently sent there, decayed (the router's own record);
    ``kv_usage``: its HBM KV usage, 0..1.
    """

    name: str
    lookup: Lookup
    pending_tokens: float = 0.0
    recent_tokens: float = 0.0
    kv_usage: float = 0.0

    @property
    def load(self) -> float:
        return self.pending_tokens + self.recent_tokens


@dataclass(frozen=True)
class Policy:
    """The knobs of the cost (docs/router.md says why each default). ``use_cache=False`` ignores
    what endpoints hold (least-load); both load weights 0 and ``load_bound=None`` ignore load
    (prefix-only)."""

    weights: TierWeights = DEFAULT_WEIGHTS
    pending_weight: float = 1.0
    balance_weight: float = 0.1
    load_bound: float | None = 1.5
    kv_full: float = 0.95
    use_cache: bool = True


@dataclass(frozen=True)
class Ranked:
    """One endpoint's place in the answer: its cost, the tokens it is predicted to serve from a
    cache (by tier) and to compute, and whether it passed the guards."""

    name: str
    cost: float
    cached_tokens: dict[str, int]
    prefill_tokens: int
    eligible: bool

    @property
    def cached_total(self) -> int:
        return sum(self.cached_tokens.values())


@dataclass(frozen=True)
class Choice:
    """Candidates best first, and why the first one won (a metrics label): ``guard`` (a cheaper
    endpoint failed a guard), ``random`` (an exact tie with the runner-up), ``cache`` (it holds
    more of the prompt than another eligible endpoint), ``load`` (caches did not decide: load
    did), ``only`` (a single candidate)."""

    ranked: tuple[Ranked, ...]
    reason: Reason
    order: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "order", tuple(r.name for r in self.ranked))


def choose(prompt: Prompt, candidates: Sequence[Candidate], policy: Policy, rng: random.Random) -> Choice:
    """Rank ``candidates`` for ``prompt``, best first. Empty ``candidates``: an empty choice."""
    bound = _load_bound(candidates, prompt.tokens, policy.load_bound)
    scored = [_score(prompt, c, policy, bound) for c in candidates]
    ranked = tuple(sorted(scored, key=lambda r: (not r.eligible, r.cost, rng.random())))
    return Choice(ranked, _reason(ranked, scored))


def _load_bound(candidates: Sequence[Candidate], tokens: int, factor: float | None) -> float | None:
    if factor is None or not candidates:
        return None
    return factor * (sum(c.load for c in candidates) + tokens) / len(candidates)


def _score(prompt: Prompt, candidate: Candidate, policy: Policy, bound: float | None) -> Ranked:
    usable = prompt.blocks[: prompt.usable_blocks]
    tiers = list(candidate.lookup(usable))[: len(usable)] if policy.use_cache and usable else []
    cached: dict[str, int] = {}
    for tier in tiers:
        cached[tier] = cached.get(tier, 0) + prompt.block_size
    computed = prompt.tokens - len(tiers) * prompt.block_size
    tier_cost = sum(policy.weights.of(t) * n for t, n in cached.items())
    load = policy.pending_weight * candidate.pending_tokens + policy.balance_weight * candidate.recent_tokens
    cost = tier_cost + computed + load
    eligible = candidate.kv_usage < policy.kv_full and (bound is None or candidate.load <= bound)
    return Ranked(candidate.name, cost, cached, computed, eligible)


def _reason(ranked: Sequence[Ranked], scored: Sequence[Ranked]) -> Reason:
    if len(ranked) <= 1:
        return "only"
    best, runner_up = ranked[0], ranked[1]
    if any(not r.eligible and r.cost < best.cost for r in scored):
        return "guard"
    if best.eligible == runner_up.eligible and best.cost == runner_up.cost:
        return "random"
    if any(r.eligible and r.cached_total < best.cached_total for r in scored):
        return "cache"
    return "load"
