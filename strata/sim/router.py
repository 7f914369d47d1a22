"""Which ready replica takes a request: the one adapter between the fleet and the router's
choice function (``strata.router.choose``, the same code the router process runs).

Each candidate is a ready pod: ``lookup`` asks its HBM prefix cache and then its lower tiers (as
the router learns them from the block-event streams), ``pending_tokens`` is the prompt work
queued or running there, ``recent_tokens`` the router's own decayed record of what it sent
there, ``kv_usage`` its HBM usage. The tier weights are derived from the profile the way
docs/router.md derives them from measurements. ``random`` (uniform, as a Kubernetes Service's
kube-proxy spreads connections) stays available for comparison.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Literal

from strata.common.tiers import LOWER_TIERS, Tier
from strata.router import choose as routing
from strata.router.load import DecayedTokens
from strata.router.weights import Measurements, TierWeights, derive
from strata.sim.engine import Engine
from strata.sim.profile import Profile
from strata.sim.requests import Seq
from strata.sim.service import Pod

RouterKind = Literal["strata", "random"]
ROUTERS: tuple[RouterKind, ...] = ("strata", "random")


class Router:
    def __init__(
        self, rng: random.Random, kind: RouterKind = "strata", profile: Profile | None = None
    ) -> None:
        if kind not in ROUTERS:
            raise ValueError(f"router: unknown {kind!r}; expected one of {', '.join(ROUTERS)}")
        self.rng = rng
        self.name = kind
        self.policy = routing.Policy(weights=weights(profile)) if profile is not None else routing.Policy()
        self.sent: dict[str, DecayedTokens] = {}

    def pick(self, seq: Seq, pods: Sequence[Pod], now: float) -> Pod:
        if len(pods) == 1:
            chosen = pods[0]
        elif self.name == "random":
            chosen = self.rng.choice(pods)
        else:
            chosen = self._choose(seq, pods, now)
        self.sent.setdefault(chosen.name, DecayedTokens()).add(seq.req.input_tokens, now)
        return chosen

    def _choose(self, seq: Seq, pods: Sequence[Pod], now: float) -> Pod:
        by_name = {p.name: p for p in pods}
        block = pods[0].engine.block if pods[0].engine is not None else 1
        prompt = routing.Prompt(seq.keys, seq.req.input_tokens, block)
        candidates = [self._candidate(p, now) for p in pods]
        return by_name[routing.choose(prompt, candidates, self.policy, self.rng).order[0]]

    def _candidate(self, pod: Pod, now: float) -> routing.Candidate:
        engine = pod.engine
        assert engine is not None
        recent = self.sent.get(pod.name)
        return routing.Candidate(
            name=pod.name,
            lookup=lambda blocks: held(engine, blocks),
            pending_tokens=float(engine.pending_tokens()),
            recent_tokens=recent.value(now) if recent is not None else 0.0,
            kv_usage=engine.cache.usage,
        )


def held(engine: Engine, blocks: Sequence[object]) -> list[Tier]:
    """Tiers of the leading blocks a replica holds: HBM first, then its lower tiers."""
    keys = [b for b in blocks if isinstance(b, bytes)]
    in_hbm = len(engine.cache.hbm.match(keys, [()] * len(keys)))
    found: list[Tier] = ["hbm"] * in_hbm
    return found + list(engine.cache.tiers.lookup(keys[in_hbm:]))


def weights(profile: Profile) -> TierWeights:
    """The router's tier weights for this hardware: KV bytes per token times prefill speed over
    each tier's read bandwidth (docs/router.md)."""
    return derive(
        Measurements(
            kv_bytes_per_token=profile.kv_bytes_per_token,
            prefill_tokens_per_s=1.0 / profile.prefill_token_s,
            read_gbps={tier: profile.read_gbps.of(tier) for tier in LOWER_TIERS},
            source=f"sim profile {profile.name}",
        )
    )
