"""A Knative / AIBrix-style KPA on concurrency (requests in flight per replica), with Knative's
defaults: a 2 s tick, the mean concurrency over a 60 s stable window and a 6 s panic window,
70% target utilisation of the per-replica target, panic when the panic window asks for at least
twice the ready replicas (then never scale down for a stable window), scale-down by at most half
per tick, and scale to zero only where the tier allows it, after a stable window with nothing in
flight plus the 30 s grace period."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from strata.sim.policies.base import Verdict, View
from strata.sim.service import PodState


@dataclass(frozen=True)
class KpaSettings:
    target: float  # requests in flight per replica (Knative's containerConcurrency target)
    utilization: float = 0.7
    stable_s: float = 60.0
    panic_s: float = 6.0
    panic_threshold: float = 2.0
    max_scale_down_rate: float = 2.0
    zero_grace_s: float = 30.0


class Kpa:
    name = "kpa"
    interval_s = 2.0

    def __init__(self, settings: KpaSettings, scale_to_zero: bool) -> None:
        self.s = settings
        self.zero_ok = scale_to_zero
        self.history: deque[tuple[float, float]] = deque()
        self.panic_until = -math.inf
        self.last_busy = 0.0

    def decide(self, view: View) -> Verdict | None:
        s = self.s
        in_flight = float(sum(view.in_flight()))
        self.history.append((view.now, in_flight))
        if in_flight:
            self.last_busy = view.now
        while self.history[0][0] < view.now - s.stable_s:
            self.history.popleft()
        stable = self._mean(view.now - s.stable_s)
        panic = self._mean(view.now - s.panic_s)
        per_pod = s.target * s.utilization
        want_stable, want_panic = math.ceil(stable / per_pod), math.ceil(panic / per_pod)
        ready = max(1, view.count(PodState.READY))
        if want_panic / ready >= s.panic_threshold:
            self.panic_until = view.now + s.stable_s
        if view.now < self.panic_until:
            want = max(want_panic, want_stable, view.desired)
            return Verdict(view.bounded(want), f"panic: concurrency {panic:.1f} over {s.panic_s:.0f} s")
        want = max(want_stable, math.ceil(view.desired / s.max_scale_down_rate))
        if want == 0 and not self._may_zero(view):
            want = 1
        return Verdict(view.bounded(want), f"concurrency {stable:.1f} over {s.stable_s:.0f} s")

    def _mean(self, since: float) -> float:
        values = [c for t, c in self.history if t >= since]
        return sum(values) / len(values) if values else 0.0

    def _may_zero(self, view: View) -> bool:
        if not self.zero_ok or view.service.gate:
            return False
        return view.now - self.last_busy >= self.s.stable_s + self.s.zero_grace_s
