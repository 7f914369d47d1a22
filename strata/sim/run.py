"""One simulation: a scenario's services on a GPU budget under one scaling policy, driven by an
event loop in simulated time (arrivals, policy ticks, pods becoming ready, samples for the plot).

At every event the fleet first advances every replica's engine to that time, so decisions see
exactly the state a controller would scrape then. The run ends once every trace is replayed and
every request has ended, or ``tail_s`` after the last arrival, whichever comes first; requests
still without a first token then count as ``unfinished``.
"""

from __future__ import annotations

import heapq
import itertools
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from strata.operator.api import ServiceTier
from strata.sim.fleet import Fleet
from strata.sim.policies.base import Scaler, View
from strata.sim.profile import Profile
from strata.sim.requests import Seq
from strata.sim.router import Router, RouterKind
from strata.sim.service import PodState, Service, ServiceConfig

SAMPLE_S = 10.0
TAIL_S = 900.0
Callback = Callable[[float], None]
ScalerFactory = Callable[[Service], Scaler]


@dataclass(frozen=True)
class Scenario:
    services: tuple[ServiceConfig, ...]
    tiers: dict[str, ServiceTier]
    profile: Profile
    gpus: int
    seed: int = 0
    router: RouterKind = "strata"


@dataclass
class RunResult:
    policy: str
    services: list[Service]
    end_s: float
    wall_s: float
    cpu_s: float  # this process's CPU time: what the run costs on a machine shared with others

    @property
    def speedup(self) -> float:
        """Simulated seconds per wall-clock second."""
        return self.end_s / self.wall_s if self.wall_s > 0 else float("inf")


class Clock:
    """The event queue: callbacks at simulated times, in order (ties in insertion order)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Callback]] = []
        self._order = itertools.count()

    def at(self, when: float, callback: Callback) -> None:
        heapq.heappush(self._heap, (when, next(self._order), callback))

    def pop(self) -> tuple[float, Callback] | None:
        if not self._heap:
            return None
        when, _, callback = heapq.heappop(self._heap)
        return when, callback


def simulate(scenario: Scenario, policy: str, scalers: ScalerFactory) -> RunResult:
    started, cpu = time.perf_counter(), time.process_time()
    clock = Clock()
    services = [Service(c, _tier(scenario, c), scenario.profile) for c in scenario.services]
    router = Router(random.Random(scenario.seed), scenario.router, scenario.profile)
    fleet = Fleet(services, scenario.gpus, router, clock.at)
    last_arrival = max((s.config.trace.span_s for s in services), default=0.0)
    deadline = last_arrival + TAIL_S
    fleet.warm_start(0.0)
    for service in services:
        scaler = scalers(service)
        service.wakes_on_arrival = getattr(scaler, "wakes_on_arrival", True)
        _feed(clock, fleet, service, 0)
        _tick(clock, fleet, service, scaler, 0.0, deadline)
    end = _loop(clock, fleet, last_arrival, deadline)
    fleet.finish(end)
    for service in services:
        _unfinished(service, end)
    return RunResult(policy, services, end, time.perf_counter() - started, time.process_time() - cpu)


def _tier(scenario: Scenario, config: ServiceConfig) -> ServiceTier:
    if config.tier not in scenario.tiers:
        known = ", ".join(sorted(scenario.tiers))
        raise ValueError(f"services.{config.name}.tier: unknown tier {config.tier!r} (known: {known})")
    return scenario.tiers[config.tier]


def _feed(clock: Clock, fleet: Fleet, service: Service, index: int) -> None:
    requests = service.config.trace.requests
    if index >= len(requests):
        return
    request = requests[index]

    def arrive(now: float) -> None:
        fleet.arrive(service, request, now)
        _feed(clock, fleet, service, index + 1)

    clock.at(request.arrival_s, arrive)


def _tick(clock: Clock, fleet: Fleet, service: Service, scaler: Scaler, when: float, deadline: float) -> None:
    def tick(now: float) -> None:
        verdict = scaler.decide(View(service, now))
        if verdict is not None:
            fleet.scale(service, verdict.replicas, now, verdict.reason)
        if now + scaler.interval_s <= deadline:
            _tick(clock, fleet, service, scaler, now + scaler.interval_s, deadline)

    clock.at(when, tick)


def _loop(clock: Clock, fleet: Fleet, last_arrival: float, deadline: float) -> float:
    sampler = _Sampler(fleet, last_arrival)
    while (event := clock.pop()) is not None and event[0] <= deadline:
        now, callback = event
        if sampler.until(now):
            return sampler.next_s - SAMPLE_S
        fleet.advance(now)
        callback(now)
    if sampler.until(deadline):  # no more events: the replicas finish what they hold
        return sampler.next_s - SAMPLE_S
    fleet.advance(deadline)
    return deadline


class _Sampler:
    """Samples the fleet every SAMPLE_S for the plot, and notices when the run is over."""

    def __init__(self, fleet: Fleet, last_arrival: float) -> None:
        self.fleet = fleet
        self.last_arrival = last_arrival
        self.next_s = 0.0

    def until(self, now: float) -> bool:
        """Sample up to ``now``; True once every trace is replayed and every request ended."""
        while self.next_s <= now:
            self.fleet.advance(self.next_s)
            self.fleet.sample(self.next_s)
            self.next_s += SAMPLE_S
            if self.next_s - SAMPLE_S > self.last_arrival and _idle(self.fleet.services):
                return True
        return False


def _idle(services: Sequence[Service]) -> bool:
    for service in services:
        if service.gate:
            return False
        for pod in service.in_state(PodState.READY, PodState.DRAINING):
            if pod.engine is not None and pod.engine.busy:
                return False
    return True


def _unfinished(service: Service, end: float) -> None:
    """Requests still queued or running when the run stops: they count, never vanish."""
    seqs: list[Seq] = list(service.gate)
    for pod in service.in_state(PodState.READY, PodState.DRAINING):
        if pod.engine is not None:
            seqs += pod.engine.waiting + pod.engine.running
    for seq in seqs:
        service.outcomes.add(seq, "unfinished", end)
