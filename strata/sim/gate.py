"""The router's door in front of one simulated service: ``strata.router.gate``'s rules with the
router configuration the operator renders (``operator/resolve.py``).

A request goes straight to a ready replica with a free slot when nobody waits ahead of it: the
router keeps at most ``max_inflight_per_endpoint`` requests in flight per worker, which the
operator sets to the worker's ``max_num_seqs``. Otherwise it waits at the router, first come
first served (one service has one priority):

- *held* while the service has no ready replica: at most ``hold.max_requests`` (256), each at
  most ``hold.timeout_s`` (300 s) from its arrival, then refused (503). A held request keeps that
  limit once replicas are up, as in the router;
- *queued* while every ready replica's slots are taken: at most ``queue.max_len`` (1024), each
  at most the tier's ``routing.queueTtlSeconds`` (the router's ``queue.ttl_s``), then refused
  (429).

Not modelled: the router's refusal at the door of a request whose predicted wait (those ahead
over the recent completion rate) is past the TTL; such a request waits and times out instead.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

from strata.operator.api import ServiceTierSpec
from strata.router.config import QueueConfig
from strata.sim.requests import Result, Seq


@dataclass(frozen=True)
class Limits:
    slots: int  # requests in flight per replica
    hold_max: int
    hold_s: float
    queue_max: int
    queue_s: float

    @classmethod
    def of(cls, tier: ServiceTierSpec, max_num_seqs: int) -> Limits:
        queue = QueueConfig()
        return cls(
            slots=max_num_seqs,
            hold_max=tier.routing.hold_max_requests,
            hold_s=float(tier.routing.hold_timeout_seconds),
            queue_max=queue.max_len,
            queue_s=float(tier.routing.queue_ttl_seconds),
        )


@dataclass(frozen=True, slots=True)
class Waiter:
    seq: Seq
    held: bool  # arrived while no replica was ready
    deadline_s: float


class Gate:
    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.waiting: deque[Waiter] = deque()
        self.held = 0  # waiters that arrived while no replica was ready
        self._next_deadline = float("inf")

    def __len__(self) -> int:
        return len(self.waiting)

    def __iter__(self) -> Iterator[Seq]:
        return (w.seq for w in self.waiting)

    def admit(self, seq: Seq, held: bool, now: float) -> Result | None:
        """Queue ``seq`` behind the others; the refusal instead, when the router would refuse it."""
        if held and self.held >= self.limits.hold_max:
            return "hold_full"
        if not held and len(self.waiting) - self.held >= self.limits.queue_max:
            return "queue_full"
        deadline = seq.arrival_s + (self.limits.hold_s if held else self.limits.queue_s)
        self.waiting.append(Waiter(seq, held, deadline))
        self.held += held
        self._next_deadline = min(self._next_deadline, deadline)
        return None

    def pop(self) -> Seq:
        waiter = self.waiting.popleft()
        self.held -= waiter.held
        return waiter.seq

    def expire(self, now: float) -> list[tuple[Seq, Result]]:
        """Remove the waiters past their limit, with the refusal each gets."""
        if now < self._next_deadline:
            return []
        gone = [w for w in self.waiting if w.deadline_s < now]
        self.waiting = deque(w for w in self.waiting if w.deadline_s >= now)
        self.held = sum(w.held for w in self.waiting)
        self._next_deadline = min((w.deadline_s for w in self.waiting), default=float("inf"))
        return [(w.seq, "hold_timeout" if w.held else "queue_timeout") for w in gone]
