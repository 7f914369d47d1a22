"""The one interface every scaling policy implements, and the view of a service it decides on.

A policy is an object per service, called every ``interval_s`` of simulated time with a
``View``; it answers the replicas it wants (or None to leave them) and why. Everything a real
controller could observe is reachable from the view: each ready pod's scrape (the worker's
``/metrics``, parsed), requests in flight per pod, arrivals and outcomes so far, the service's
tier and bounds, and the profile (what offline profiling would have measured).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from strata.operator.autoscale.metrics import PodSample
from strata.sim.requests import Outcome
from strata.sim.service import PodState, Service


@dataclass(frozen=True)
class Verdict:
    replicas: int
    reason: str


@dataclass(frozen=True)
class Load:
    """Arrivals in a window: how many, mean input and output tokens."""

    requests: int
    input_tokens: float
    output_tokens: float


@dataclass(frozen=True)
class View:
    service: Service
    now: float

    @property
    def desired(self) -> int:
        return self.service.desired

    def count(self, *states: PodState) -> int:
        return len(self.service.in_state(*states))

    def scrapes(self) -> dict[str, PodSample]:
        """Every ready pod's metrics now, keyed by pod name (a replaced pod is a new key)."""
        found: dict[str, PodSample] = {}
        for pod in self.service.in_state(PodState.READY):
            engine = pod.engine
            assert engine is not None
            found[pod.name] = engine.tally.sample(engine.cache.usage, len(engine.waiting))
        return found

    def in_flight(self) -> list[int]:
        """Requests in each ready pod (running and waiting), plus those waiting at the router."""
        counts = [p.engine.in_flight for p in self.service.in_state(PodState.READY) if p.engine]
        if self.service.gate:
            counts.append(len(self.service.gate))
        return counts

    def load(self, seconds: float) -> Load:
        arrivals = self.service.arrivals
        start = bisect.bisect_left(arrivals, (self.now - seconds,))
        window = arrivals[start:]
        if not window:
            return Load(0, 0.0, 0.0)
        n = len(window)
        return Load(n, sum(a[1] for a in window) / n, sum(a[2] for a in window) / n)

    def outcomes(self, seconds: float) -> Sequence[Outcome]:
        """Requests that ended within the last ``seconds``."""
        since = self.now - seconds
        found: list[Outcome] = []
        for outcome in reversed(self.service.outcomes.items):
            if outcome.end_s < since - _SLACK_S:  # replicas report slightly out of order
                break
            if outcome.end_s >= since:
                found.append(outcome)
        return found

    def bounded(self, replicas: int) -> int:
        return min(max(replicas, self.service.min_replicas), self.service.max_replicas)


_SLACK_S = 60.0


class Scaler(Protocol):
    """``wakes_on_arrival`` (optional, default True): a service at zero gets one replica at its
    first request, as an activator does; False: the policy wakes it itself."""

    name: str
    interval_s: float

    def decide(self, view: View) -> Verdict | None: ...
