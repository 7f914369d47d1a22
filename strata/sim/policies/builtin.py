"""The project's own autoscaler, as the operator runs it: every ``autoscale_interval_s`` the
ready pods are scraped, ``strata.operator.autoscale.signals.aggregate`` turns two scrapes into
the interval's signals, and ``strata.operator.autoscale.decide.decide`` decides with the
service's ServiceTier policy (``Policy.of``), keeping its ``History`` as the loop does."""

from __future__ import annotations

from dataclasses import replace

from strata.operator.autoscale.decide import History, Observation, Policy, decide
from strata.operator.autoscale.signals import Scrape, aggregate
from strata.operator.settings import OperatorSettings
from strata.sim.policies.base import Verdict, View
from strata.sim.service import Service


class Builtin:
    name = "builtin"
    interval_s = float(OperatorSettings().autoscale_interval_s)

    def __init__(self, service: Service) -> None:
        bounds = {"minReplicas": service.config.min_replicas, "maxReplicas": service.config.max_replicas}
        self.policy = Policy.of(service.spec.model_dump(by_alias=True), bounds)
        self.previous: Scrape | None = None
        self.history: History | None = None

    def decide(self, view: View) -> Verdict | None:
        current = Scrape(view.now, view.scrapes())
        previous, self.previous = self.previous, current
        if previous is None:
            return None  # the first interval only primes the deltas, as after an operator start
        history = self.history = self.history or History(started=view.now)
        seen = Observation.of(aggregate(previous, current), ready_replicas=len(current.pods))
        if view.service.held:  # the router's held requests wake the service (issue 9's wake path)
            seen = replace(seen, had_traffic=True)
        decision = decide(view.desired, seen, self.policy, history, view.now)
        history.record(
            view.now, decision.recommendation, seen.had_traffic, self.policy.keep_s, seen.prefill_utilization
        )
        return Verdict(decision.replicas, decision.reason)
