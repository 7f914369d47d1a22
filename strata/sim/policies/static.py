"""Static provisioning: a fixed replica count for the whole run, sized before it starts
(``strata.sim.sizing``: at the peak, or at the mean)."""

from __future__ import annotations

import math

from strata.sim.policies.base import Verdict, View


class Static:
    interval_s = math.inf  # decides once, at the start

    def __init__(self, name: str, replicas: int, why: str) -> None:
        self.name = name
        self.replicas = replicas
        self.why = why

    def decide(self, view: View) -> Verdict | None:
        return Verdict(view.bounded(self.replicas), self.why)
