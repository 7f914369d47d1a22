"""The endpoints the router may send to, their state, and the candidates ``choose`` ranks.

An endpoint is one worker Pod (or a fixed URL in local runs). Discovery says whether it is
ready or terminating; the proxy marks it down for a while after it failed a request (refused,
reset, garbage, timed out) and cancels the attempts still waiting on it, so they go elsewhere.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from strata.common.tiers import Tier
from strata.router.choose import Candidate
from strata.router.load import DecayedTokens
from strata.router.view import BlockView, FollowBudget, SharedPool

DOWN_S = 10.0  # a failed endpoint gets no new requests for this long


class EndpointDown(Exception):
    """The endpoint an attempt was waiting on was marked down; the attempt goes elsewhere."""


@dataclass(frozen=True)
class Address:
    """Where an endpoint is: its API base URL and the URLs of its block-event streams."""

    url: str
    events: dict[str, str]  # source (worker, sidecar) -> URL
    expect: str | None = None  # the sidecar's look-ahead (POST): None without a sidecar


@dataclass
class Endpoint:
    name: str
    address: Address
    view: BlockView
    ready: bool = True
    terminating: bool = False
    down_until: float = 0.0
    down_reason: str = ""
    inflight: int = 0
    sent: DecayedTokens = field(default_factory=DecayedTokens)
    pending_tokens: float = 0.0
    kv_usage: float = 0.0
    attempts: set[asyncio.Future[None]] = field(default_factory=set)

    def state(self, now: float) -> str:
        if self.terminating:
            return "terminating"
        if not self.ready:
            return "not_ready"
        return "down" if now < self.down_until else "ready"

    def routable(self, now: float) -> bool:
        return self.state(now) == "ready"

    def candidate(self, now: float) -> Candidate:
        def lookup(blocks: Sequence[Hashable]) -> list[Tier]:
            return self.view.lookup(blocks, now)

        return Candidate(self.name, lookup, self.pending_tokens, self.sent.value(now), self.kv_usage)


class Fleet:
    def __init__(self, max_inflight: int, record_blocks: int, followed_blocks: int | None = None) -> None:
        self.max_inflight = max_inflight
        self.record_blocks = record_blocks
        self.shared = SharedPool()
        self.follow = FollowBudget(followed_blocks)
        self.endpoints: dict[str, Endpoint] = {}

    def add(self, name: str, address: Address) -> Endpoint:
        endpoint = Endpoint(name, address, BlockView(self.shared, self.record_blocks, self.follow))
        self.endpoints[name] = endpoint
        return endpoint

    def remove(self, name: str) -> Endpoint | None:
        endpoint = self.endpoints.pop(name, None)
        if endpoint is not None:
            endpoint.view.forget()
        return endpoint

    def any_ready(self) -> bool:
        """Whether the service has a replica at all (a down one comes back; none means hold)."""
        return any(e.ready and not e.terminating for e in self.endpoints.values())

    def routable(self, now: float) -> list[Endpoint]:
        return [e for e in self.endpoints.values() if e.routable(now)]

    def free(self, now: float) -> list[Endpoint]:
        return [e for e in self.routable(now) if e.inflight < self.max_inflight]

    def candidates(self, now: float) -> list[Candidate]:
        return [e.candidate(now) for e in self.free(now)]

    def states(self, now: float) -> dict[str, int]:
        counts = dict.fromkeys(("ready", "down", "not_ready", "terminating"), 0)
        for endpoint in self.endpoints.values():
            counts[endpoint.state(now)] += 1
        return counts

    def mark_down(self, endpoint: Endpoint, reason: str, now: float) -> None:
        endpoint.down_until = now + DOWN_S
        endpoint.down_reason = reason
        for attempt in list(endpoint.attempts):
            if not attempt.done():
                attempt.set_exception(EndpointDown(reason))
