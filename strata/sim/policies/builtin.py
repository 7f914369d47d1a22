"""The project's own autoscaler, as the operator runs it: every ``autoscale_interval_s`` the
ready pods are scraped, ``strata.operator.autoscale.signals.aggregate`` turns two scrapes into
the interval's signals, and ``strata.operator.autoscale.decide.decide`` decides with the
service's ServiceTier policy (``Policy.of``), keeping its ``History`` as the loop does."""

from __future__ import annotations

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
        agg = aggregate(previous, current)
        history = self.history = self.history or History(started=view.now)
        seen = Observation(
            kv_cache_usage=agg.kv_cache_usage,
            ttft_p95_ms=agg.ttft_p95_s * 1000 if agg.ttft_p95_s is not None else None,
            had_traffic=agg.had_traffic or bool(view.service.held),
        )
        decision = decide(view.desired, seen, self.policy, history, view.now)
        keep = max(self.policy.scale_up_window_s, self.policy.scale_down_window_s)
        history.record(view.now, decision.recommendation, seen.had_traffic, keep)
        return Verdict(decision.replicas, decision.reason)
