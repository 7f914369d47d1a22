"""Tier priority at the door, and holding requests while the service is at zero.

A request goes straight to ``choose`` when an endpoint has a free slot (``max_inflight_per_endpoint``)
and nobody of equal or higher priority waits. Otherwise it waits: highest priority first, first
come first served within a priority. Waiting is bounded:

- *queued* (replicas exist, all busy): at most ``queue.max_len`` waiting, at most ``queue.ttl_s``
  each. A request whose predicted wait (those ahead of it over the recent completion rate) is
  past the TTL gets 429 at once instead of timing out late; one that does time out gets 429 too,
  both with Retry-After.
- *held* (no ready replica: the service is at zero, or all are starting): at most
  ``hold.max_requests``, at most ``hold.timeout_s`` each, then 503 with Retry-After. The number
  held is a metric the operator's autoscaler reads to wake the service.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from strata.router.choose import Choice, Policy, Prompt, choose
from strata.router.config import RouterConfig
from strata.router.fleet import Endpoint, Fleet
from strata.router.load import DecayedTokens

RATE_WINDOW_S = 30.0


class Refused(Exception):
    """The request is turned away at the door: an OpenAI-shaped error with Retry-After."""

    def __init__(self, status: int, message: str, retry_after_s: int, reason: str) -> None:
        super().__init__(message)
        self.status, self.message, self.retry_after_s, self.reason = status, message, retry_after_s, reason


@dataclass(frozen=True)
class Route:
    """Where a request goes: endpoints best first (the first one holds a slot), and why."""

    endpoints: list[Endpoint]
    reason: str
    predicted_cached: dict[str, int]  # by endpoint name: prompt tokens it was predicted to hold
    queued_s: float


@dataclass(order=True)
class _Waiter:
    key: tuple[int, int]  # (-priority, arrival order)
    prompt: Prompt = field(compare=False)
    arrived: float = field(compare=False)
    held: bool = field(compare=False)
    future: asyncio.Future[Route] = field(compare=False)
    expected_at: str | None = field(default=None, compare=False)  # the endpoint it will likely get


@dataclass(frozen=True)
class Queued:
    """A request waiting at the router, where it is expected to go (``announce``)."""

    request: str
    prompt: Prompt
    endpoint: str


class Gate:
    def __init__(
        self,
        config: RouterConfig,
        fleet: Fleet,
        rng: random.Random,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config, self.fleet, self.rng, self.clock = config, fleet, rng, clock
        r = config.routing
        self.policy = Policy(r.weights, 1.0, r.balance_weight, r.load_bound, r.kv_full)
        self._waiting: list[_Waiter] = []
        self._order = itertools.count()
        self._rr = itertools.count()
        self.completions = DecayedTokens(RATE_WINDOW_S)

    def queue(self) -> list[Queued]:
        """The requests waiting for a slot (not those held at zero), nearest first, each with
        the endpoint it is expected to get."""
        waiting = sorted(w for w in self._waiting if not w.held and not w.future.done())
        return [Queued(f"q{w.key[1]}", w.prompt, w.expected_at) for w in waiting if w.expected_at]

    # ---- counts (metrics) ----

    def held(self) -> int:
        return sum(1 for w in self._waiting if w.held and not w.future.done())

    def queued(self) -> int:
        return sum(1 for w in self._waiting if not w.held and not w.future.done())

    # ---- entering and leaving ----

    async def enter(self, prompt: Prompt, priority: int) -> Route:
        now = self.clock()
        if not self._ahead(priority) and (route := self._route(prompt, now, now)) is not None:
            return route
        waiter = self._admit_waiter(prompt, priority, now)
        limit = self.config.hold.timeout_s if waiter.held else self.config.queue.ttl_s
        try:
            return await asyncio.wait_for(waiter.future, limit)
        except TimeoutError:
            raise self._timed_out(waiter) from None
        except asyncio.CancelledError:  # the caller left; a slot it was just given goes back
            if waiter.future.done() and not waiter.future.cancelled():
                self.finished(waiter.future.result().endpoints[0], completed=False)
            raise
        finally:
            self._forget(waiter)

    def finished(self, endpoint: Endpoint, completed: bool = True) -> None:
        """A request let go of its slot: the next waiter may go. ``completed`` ones count
        towards the completion rate that predicts queue waits."""
        endpoint.inflight = max(0, endpoint.inflight - 1)
        if completed:
            self.completions.add(1, self.clock())
        self.dispatch()

    def moved(self, source: Endpoint, target: Endpoint) -> None:
        """A retry moves the request's slot to the next endpoint of its fallback list."""
        source.inflight = max(0, source.inflight - 1)
        target.inflight += 1

    def dispatch(self) -> None:
        """Hand free slots to waiters, highest priority first."""
        now = self.clock()
        while self._waiting:
            waiter = self._waiting[0]
            if waiter.future.done():
                heapq.heappop(self._waiting)
                continue
            route = self._route(waiter.prompt, now, waiter.arrived)
            if route is None:
                return
            heapq.heappop(self._waiting)
            waiter.future.set_result(route)

    # ---- decisions ----

    def _ahead(self, priority: int) -> bool:
        return any(-w.key[0] >= priority and not w.future.done() for w in self._waiting)

    def _route(self, prompt: Prompt, now: float, arrived: float) -> Route | None:
        free = {e.name: e for e in self.fleet.free(now)}
        if not free:
            return None
        choice: Choice = choose(prompt, [e.candidate(now) for e in free.values()], self.policy, self.rng)
        order, reason = list(choice.order), str(choice.reason)
        if self.config.policy == "round-robin":
            names = sorted(free)
            first = next(self._rr) % len(names)
            order, reason = names[first:] + names[:first], "round-robin"
        cached = {r.name: r.cached_total for r in choice.ranked}
        winner = free[order[0]]
        winner.inflight += 1
        winner.sent.add(max(0, prompt.tokens - cached[winner.name]), now)
        return Route([free[n] for n in order], reason, cached, now - arrived)

    def _admit_waiter(self, prompt: Prompt, priority: int, now: float) -> _Waiter:
        held = not self.fleet.any_ready()
        if held and self.held() >= self.config.hold.max_requests:
            raise Refused(
                503, f"no replica ready: {self.held()} requests already held", self._retry(None), "hold_full"
            )
        if not held:
            self._check_queue(priority)
        loop = asyncio.get_running_loop()
        waiter = _Waiter((-priority, next(self._order)), prompt, now, held, loop.create_future())
        waiter.expected_at = None if held else self._expected_at(prompt, now)
        heapq.heappush(self._waiting, waiter)
        return waiter

    def _expected_at(self, prompt: Prompt, now: float) -> str | None:
        """Where a queued request will likely go once a slot frees: the first of the ranking
        over every routable endpoint, full ones included."""
        candidates = [e.candidate(now) for e in self.fleet.routable(now)]
        if not candidates or self.config.policy == "round-robin":
            return None
        return str(choose(prompt, candidates, self.policy, self.rng).order[0])

    def _check_queue(self, priority: int) -> None:
        if self.queued() >= self.config.queue.max_len:
            raise Refused(429, "server busy: request queue is full", self._retry(None), "queue_full")
        wait = self._predicted_wait(priority)
        ttl = self.config.queue.ttl_s
        if wait is not None and wait > ttl:
            message = f"server busy: the queue would hold this request about {wait:.0f}s, past {ttl:g}s"
            raise Refused(429, message, self._retry(wait), "queue_ttl")

    def _predicted_wait(self, priority: int) -> float | None:
        """Seconds until the requests ahead drain at the recent completion rate (None: no rate yet)."""
        rate = self.completions.value(self.clock()) / RATE_WINDOW_S
        if rate <= 0:
            return None
        ahead = sum(1 for w in self._waiting if -w.key[0] >= priority and not w.future.done())
        return (ahead + 1) / rate

    def _timed_out(self, waiter: _Waiter) -> Refused:
        if waiter.held:
            limit = self.config.hold.timeout_s
            return Refused(
                503, f"no replica became ready within {limit:g}s", self._retry(None), "hold_timeout"
            )
        return Refused(429, "server busy: queue timeout", self._retry(None), "queue_ttl")

    def _retry(self, wait: float | None) -> int:
        return max(1, math.ceil(wait if wait is not None else self.config.queue.ttl_s / 10))

    def _forget(self, waiter: _Waiter) -> None:
        if waiter in self._waiting:
            self._waiting.remove(waiter)
            heapq.heapify(self._waiting)
