"""The project's own autoscaler, as the operator runs it: every ``autoscale_interval_s`` the
ready pods are scraped, ``strata.operator.autoscale.signals.aggregate`` turns two scrapes into
the interval's signals, and ``strata.operator.autoscale.decide.decide`` decides with the
service's ServiceTier policy (``Policy.of``), keeping its ``History`` as the loop does. A service
at zero is woken from this loop too, by ``strata.operator.autoscale.wake.wake_to`` on the count
of requests held at the router, not at the first request's arrival."""

from __future__ import annotations

from dataclasses import replace

from strata.operator.autoscale.decide import History, Observation, Policy, decide, record_decision
from strata.operator.autoscale.signals import Scrape, aggregate
from strata.operator.autoscale.wake import wake_to
from strata.operator.settings import OperatorSettings
from strata.sim.policies.base import Verdict, View
from strata.sim.service import Service


class Builtin:
    name = "builtin"
    interval_s = float(OperatorSettings().autoscale_interval_s)
    wakes_on_arrival = False

    def __init__(self, service: Service) -> None:
        self.bounds = {
            "minReplicas": service.config.min_replicas,
            "maxReplicas": service.config.max_replicas,
            "engine": {"maxNumSeqs": service.profile.max_num_seqs},
        }
        self.policy = Policy.of(service.spec.model_dump(by_alias=True), self.bounds)
        self.previous: Scrape | None = None
        self.history: History | None = None

    def decide(self, view: View) -> Verdict | None:
        held = float(view.service.gate.held)
        if view.desired == 0:
            return self._wake(view, held)
        current = Scrape(view.now, view.scrapes())
        previous, self.previous = self.previous, current
        if previous is None:
            return None  # the first interval only primes the deltas, as after an operator start
        history = self.history = self.history or History(started=view.now)
        ready = len(current.pods)
        seen = Observation.of(aggregate(previous, current), ready, held if ready == 0 else 0.0)
        if held:  # requests held at the router are traffic
            seen = replace(seen, had_traffic=True)
        decision = decide(view.desired, seen, self.policy, history, view.now)
        record_decision(history, view.now, view.desired, seen, self.policy, decision)
        return Verdict(decision.replicas, decision.reason)

    def _wake(self, view: View, held: float) -> Verdict | None:
        """``wake.wake``: at zero with requests held, to ``wake_to``'s count; the idle clock restarts."""
        target = wake_to({**self.bounds, "replicas": 0}, held, self.policy)
        if target is None:
            self.previous = Scrape(view.now, {})  # the loop scrapes a service at zero when not waking it
            return None
        history = self.history = self.history or History(started=view.now)
        history.last_traffic = view.now
        return Verdict(target, f"{held:.0f} requests held at the router while at zero: 0 -> {target}")
