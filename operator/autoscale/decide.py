"""The built-in autoscaler's decision: a pure function, in the spirit of the Kubernetes HPA.

Each signal's ratio to its target asks for ceil(replicas it was measured over * ratio); the
recommendation is the largest ask, or the current count while that signal is within tolerance.
prefillUtilization's replicas are the current ones (its load is spread over them); kvCacheUsage
and TTFT p95 are measured on the ready pods, so they scale those (``_term``).

- prefillUtilization (the share of time replicas spend computing prompt tokens) is the load
  signal: it falls as 1 / replicas, so the ratio sizes the service as an HPA sizes on CPU. What is
  averaged over the last UTILIZATION_WINDOW_S (an operator setting; one long prompt makes a single
  interval spiky) is the load itself, replicas' worth of prompt computing (``prefill_busy``: the
  utilization times the pods it was measured on), and the utilization compared with the target
  is that load over the current replicas. Averaging utilizations measured at other replica
  counts, or multiplying the ready pods' utilization by replicas still starting, counted the
  same load several times over: in strata sim, premium went from 4 to its maxReplicas 16 at the
  trace's start and stayed there for eight minutes while 11 carried the load.
- TTFT p95 counts only while requests wait for a replica (requestsWaiting > 0) or when that is
  unknown: without a queue, a TTFT over target comes from prompts too long to prefill within it,
  which more replicas would not shorten (the strata sim runs on the Mooncake traces showed the
  service pinned at maxReplicas otherwise; docs/autoscaling.md). An interval without a first
  token while requests wait keeps the last measured p95 (``_carried_ttft``). Its ratio is capped
  at TTFT_MAX_RATIO: a queue's wait says the replicas are short, not by how much; and it does not
  count while the queue drains (under DRAINING of what waited at the last interval): the TTFT
  is then the served requests' past wait.

A woken service whose replicas are all still starting, while its routers hold more requests than
those replicas take in flight (``maxNumSeqs`` each), takes the tier's scale-up step at once: it
demonstrably needs more, and waiting to measure the first replica costs a whole pod start-up
(strata sim: a batch job waking from zero refused or missed half its requests otherwise).

Recommendations are stabilised like the HPA's behaviour: scale up only to the lowest
recommendation of the scale-up window and down only to the highest of the scale-down window.
A replica count the service was scaled down to and then queued at (a queue's TTFT decided the
scale-up that followed) is not scaled down to again for QUEUE_HOLD_S (``_queue_floor``).
Then the step limits and the replica bounds apply. Zero is reached only by idleness, never by
the ratio: with the tier's permission and the service's minReplicas 0, after no traffic for the
tier's idle window."""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from strata.operator.api import ServiceTierSpec
from strata.operator.autoscale.signals import Aggregate

UTILIZATION_WINDOW_S = 120.0
# The most a TTFT over target multiplies the ready replicas by in one decision: the HPA's default
# scale-up rate (100%). Still short once the new pods serve, it doubles again.
TTFT_MAX_RATIO = 2.0
# How long a replica count scaled down to, and then queued at, is not scaled down to again; and
# how long after a scale-down a queue counts as its consequence (``History.queued``, ``downs``).
QUEUE_HOLD_S = 600.0
# A queue down to under this share of what waited at the last interval is draining (``_ttft_term``).
DRAINING = 0.5


@dataclass(frozen=True)
class Policy:
    """The tier's autoscaling policy and TTFT target, and the service's replica bounds."""

    target_kv_cache_usage: float = 0.75
    target_prefill_utilization: float = 0.5
    target_ttft_ms: float = 1000.0
    tolerance: float = 0.1
    scale_up_window_s: float = 0.0
    scale_down_window_s: float = 300.0
    max_scale_up_step: int = 4
    max_scale_down_step: int = 1
    min_replicas: int = 1
    max_replicas: int = 16
    scale_to_zero: bool = False
    scale_to_zero_idle_s: float = 600.0
    slots_per_replica: int = 64  # requests the router keeps in flight per replica: maxNumSeqs

    @property
    def keep_s(self) -> float:
        """How long the history must keep recommendations: the longer stabilisation window."""
        return max(self.scale_up_window_s, self.scale_down_window_s)

    @classmethod
    def of(cls, tier_spec: Mapping[str, Any] | None, service_spec: Mapping[str, Any]) -> Policy:
        """From a ServiceTier's spec (None: the defaults) and an InferenceService's spec, both as
        on the wire; the replica bounds are the narrower of the service's and the tier's."""
        tier = _tier_spec(json.dumps(dict(tier_spec or {}), sort_keys=True, default=dict))
        auto = tier.autoscaling
        return cls(
            target_kv_cache_usage=auto.target_kv_cache_usage,
            target_prefill_utilization=auto.target_prefill_utilization,
            target_ttft_ms=float(tier.slo.ttft_p95_ms),
            tolerance=auto.tolerance,
            scale_up_window_s=float(auto.scale_up_stabilization_seconds),
            scale_down_window_s=float(auto.scale_down_stabilization_seconds),
            max_scale_up_step=auto.max_scale_up_step,
            max_scale_down_step=auto.max_scale_down_step,
            min_replicas=max(int(service_spec.get("minReplicas", 1)), auto.min_replicas),
            max_replicas=min(int(service_spec.get("maxReplicas", 1)), auto.max_replicas),
            scale_to_zero=auto.scale_to_zero,
            scale_to_zero_idle_s=float(auto.scale_to_zero_idle_seconds),
            slots_per_replica=int(
                (service_spec.get("engine") or {}).get("maxNumSeqs", cls.slots_per_replica)
            ),
        )


@functools.lru_cache(maxsize=64)
def _tier_spec(text: str) -> ServiceTierSpec:
    """A tier's spec parsed once per content: the autoscaler asks for every service every
    interval, and validating the same few tiers again was about 4% of the operator's CPU with
    300 services. The parsed spec is only read."""
    return ServiceTierSpec.model_validate(json.loads(text))


@dataclass(frozen=True)
class Observation:
    """What decide reads from the last interval; None where a signal is unknown."""

    kv_cache_usage: float | None
    ttft_p95_ms: float | None
    had_traffic: bool
    prefill_utilization: float | None = None
    # Replicas' worth of prompt computing (None: utilization x the current replicas, as if all
    # were measured)
    prefill_busy: float | None = None
    requests_waiting: int | None = None  # None: unknown (TTFT then counts as before)
    ready_replicas: int | None = None  # None: unknown
    requests_held: float = 0.0  # at the routers, while no replica is ready

    @classmethod
    def of(cls, agg: Aggregate, ready_replicas: int | None = None, requests_held: float = 0.0) -> Observation:
        """``ready_replicas`` 0 (a woken service whose pod is still starting, with requests held
        at its routers) counts as traffic: idleness cannot be judged until a replica serves."""
        return cls(
            kv_cache_usage=agg.kv_cache_usage,
            ttft_p95_ms=agg.ttft_p95_s * 1000 if agg.ttft_p95_s is not None else None,
            had_traffic=agg.had_traffic or ready_replicas == 0,
            prefill_utilization=agg.prefill_utilization,
            prefill_busy=agg.prefill_busy,
            requests_waiting=agg.requests_waiting,
            ready_replicas=ready_replicas,
            requests_held=requests_held,
        )


@dataclass
class History:
    """What one service's earlier decisions left behind (kept in memory by the loop)."""

    started: float  # when this history began: idleness before it is unknown
    # Prefill utilization is averaged over this long (the operator's STRATA_UTILIZATION_WINDOW_S).
    utilization_window_s: float = UTILIZATION_WINDOW_S
    recommendations: list[tuple[float, int]] = field(default_factory=list)
    last_traffic: float | None = None
    busy: list[tuple[float, float]] = field(default_factory=list)  # prefill_busy seen
    last_ttft_ms: float | None = None  # the last interval's TTFT p95 that had a first token
    last_waiting: int | None = None  # requests waiting at the last interval
    downs: list[tuple[float, int]] = field(default_factory=list)  # Decision.down_to seen
    queued: list[tuple[float, int]] = field(default_factory=list)  # Decision.queued seen

    def record(
        self,
        now: float,
        recommendation: int | None,
        had_traffic: bool,
        keep_s: float,
        busy: float | None = None,
        ttft_ms: float | None = None,
        queued: int | None = None,
        down_to: int | None = None,
        waiting: int | None = None,
    ) -> None:
        """``recommendation`` None: the interval had nothing to scale on, and no vote in the
        stabilisation windows (a vote for the current count would hold a scale-up for a whole
        window after every interval without a signal)."""
        self.recommendations = [(t, r) for t, r in self.recommendations if now - t <= keep_s]
        if recommendation is not None:
            self.recommendations.append((now, recommendation))
        if had_traffic:
            self.last_traffic = now
        if ttft_ms is not None:
            self.last_ttft_ms = ttft_ms
        self.last_waiting = waiting
        self.busy = [(t, b) for t, b in self.busy if now - t < self.utilization_window_s]
        if busy is not None:
            self.busy.append((now, busy))
        self.queued = [(t, n) for t, n in self.queued if now - t < QUEUE_HOLD_S]
        if queued is not None:
            self.queued.append((now, queued))
        self.downs = [(t, n) for t, n in self.downs if now - t < QUEUE_HOLD_S]
        if down_to is not None:
            self.downs.append((now, down_to))


@dataclass(frozen=True)
class Decision:
    replicas: int
    recommendation: int | None  # before stabilisation, steps and bounds: what the history keeps
    reason: str
    # The ready replicas requests queued at, when that queue decided this scale-up and the service
    # had been scaled down to that count (within QUEUE_HOLD_S).
    queued: int | None = None

    def down_to(self, current: int) -> int | None:
        """The replicas this decision scales down to from ``current`` (not zero: that is idleness)."""
        return self.replicas if 0 < self.replicas < current else None

    def changes(self, current: int) -> bool:
        return self.replicas != current


def decide(current: int, seen: Observation, policy: Policy, history: History, now: float) -> Decision:
    if _idle(seen, policy, history, now):
        idle_s = now - (history.last_traffic if history.last_traffic is not None else history.started)
        reason = f"no traffic for {idle_s:.0f} s >= scaleToZeroIdleSeconds {policy.scale_to_zero_idle_s:.0f}"
        return Decision(0, 0, f"{reason}: {current} -> 0")
    backlog = _backlog(current, seen, policy)
    if backlog is not None:
        return backlog
    utilization = _utilization(current, seen, history, now)
    term, why = _term(current, _carried_ttft(seen, history), policy, utilization, history.last_waiting)
    if term is None or current == 0:
        # Nothing to scale on, or scaled to zero (a request wakes the service, not this loop).
        floor = max(policy.min_replicas, 1) if current > 0 else current
        target = min(max(current, floor), policy.max_replicas)
        vote = None if term is None and current > 0 else target
        return Decision(target, vote, _bounded(why or "no signals", current, target, policy))
    if abs(term.ratio - 1.0) <= policy.tolerance:
        recommendation = current
        why = f"{why}, within tolerance {policy.tolerance:g}"
    else:
        recommendation = term.replicas
    stabilised, note = _stabilise(current, recommendation, policy, history, now)
    stabilised, note = _queue_floor(current, stabilised, note, history, now)
    stepped = min(max(stabilised, current - policy.max_scale_down_step), current + policy.max_scale_up_step)
    if stepped != stabilised:
        step = policy.max_scale_up_step if stepped > current else policy.max_scale_down_step
        note = f"max step {step}"
    floor = max(policy.min_replicas, 1)
    target = min(max(stepped, floor), policy.max_replicas)
    if target != stepped:
        note = f"clamped to [{floor}, {policy.max_replicas}]"
    reason = f"{why}: {current} -> {target}" + (f" ({note})" if note else "")
    ready = round(term.basis)
    into = any(n == ready for t, n in history.downs if now - t < QUEUE_HOLD_S)
    queued = ready if term.queue and target > current and into else None
    return Decision(target, recommendation, reason, queued)


def backlog(current: int, held: float, policy: Policy) -> int | None:
    """Replicas for a service none of whose ``current`` replicas is ready yet, while its routers
    hold ``held`` requests: the tier's step more when they hold more than those replicas take in
    flight; None when they do not (or the step is spent)."""
    if current <= 0 or held <= current * policy.slots_per_replica:
        return None
    target = min(current + policy.max_scale_up_step, policy.max_replicas)
    return target if target > current else None


def _backlog(current: int, seen: Observation, policy: Policy) -> Decision | None:
    target = backlog(current, seen.requests_held, policy) if seen.ready_replicas == 0 else None
    if target is None:
        return None
    why = f"{seen.requests_held:.0f} requests held at the router, no replica ready"
    return Decision(target, target, f"{why}: {current} -> {target} (max step {policy.max_scale_up_step})")


def prefill_busy(current: int, seen: Observation) -> float | None:
    """The interval's replicas' worth of prompt computing (what ``History.record`` keeps)."""
    if seen.prefill_busy is not None:
        return seen.prefill_busy
    return seen.prefill_utilization * current if seen.prefill_utilization is not None else None


def record_decision(
    history: History, now: float, current: int, seen: Observation, policy: Policy, decision: Decision
) -> None:
    """What ``history`` keeps of an interval decided from ``current`` replicas: one call for the
    operator's loop and the simulator's policy, so that both remember the same."""
    history.record(
        now,
        decision.recommendation,
        seen.had_traffic,
        policy.keep_s,
        prefill_busy(current, seen),
        seen.ttft_p95_ms,
        decision.queued,
        decision.down_to(current),
        seen.requests_waiting,
    )


def _utilization(current: int, seen: Observation, history: History, now: float) -> float | None:
    """The mean load over the window (what was recorded, and this interval's) over the current
    replicas: the utilization they would have under it."""
    values = [b for t, b in history.busy if now - t < history.utilization_window_s]
    if (busy := prefill_busy(current, seen)) is not None:
        values.append(busy)
    if not values or current <= 0:
        return None
    return sum(values) / len(values) / current


def _carried_ttft(seen: Observation, history: History) -> Observation:
    """An interval in which no request got its first token while some wait for a replica (long
    generations hold every slot) has no TTFT, though its queue is what TTFT measures: the last
    measured p95 stands for it until a first token comes or the queue empties. Without it, such
    intervals voted the current count and an output-heavy load was never scaled up."""
    if seen.ttft_p95_ms is not None or not seen.requests_waiting or history.last_ttft_ms is None:
        return seen
    return replace(seen, ttft_p95_ms=history.last_ttft_ms)


@dataclass(frozen=True)
class _Term:
    """One signal's vote: ``ratio`` to its target over the ``basis`` replicas it was measured on."""

    ratio: float
    basis: float
    why: str
    queue: bool = False  # the TTFT of requests waiting for a replica

    @property
    def replicas(self) -> int:
        return math.ceil(self.basis * self.ratio)


def _term(
    current: int,
    seen: Observation,
    policy: Policy,
    utilization: float | None,
    earlier_waiting: int | None = None,
) -> tuple[_Term | None, str]:
    """The signal that asks for the most replicas. Prefill utilization is the load over the
    current replicas, so it scales them; KV usage and TTFT are measured on the ready pods only,
    so they scale those: multiplied by replicas still starting, one reading counted the starting
    pods as loaded too, and every interval of a pod's start-up asked for more again. (Pods still
    starting thus count as idle, as the HPA counts pods not yet ready when it scales up; what
    keeps them from being scaled down before they serve is the scale-down window, which holds
    the recommendation that asked for them, in every default tier longer than a pod's start.)"""
    measured = float(seen.ready_replicas) if seen.ready_replicas else float(current)
    terms: list[_Term] = []
    if utilization is not None:
        target = policy.target_prefill_utilization
        why = f"prefillUtilization {utilization:.2f} {_cmp(utilization, target)} target {target:.2f}"
        terms.append(_Term(utilization / target, float(current), why))
    if seen.kv_cache_usage is not None:
        kv, target = seen.kv_cache_usage, policy.target_kv_cache_usage
        why = f"kvCacheUsage {kv:.2f} {_cmp(kv, target)} target {target:.2f}"
        terms.append(_Term(kv / target, measured, why))
    ttft, note = _ttft_term(seen, policy, measured, earlier_waiting)
    if ttft is not None:
        terms.append(ttft)
    if not terms:
        return None, note.strip(" ()")
    best = max(terms, key=lambda t: (t.replicas, t.ratio))
    return best, best.why + note


def _ttft_term(
    seen: Observation, policy: Policy, measured: float, earlier_waiting: int | None
) -> tuple[_Term | None, str]:
    """TTFT over target counts only while requests wait; its ratio is capped at TTFT_MAX_RATIO.
    A queue says the replicas are short, not by how much: its wait grows with the backlog, not
    with the replicas missing (in strata sim, a p95 of 26 s over a 300 ms target asked 3 ready
    replicas for 262 and took the service to its maximum of 16 while the first new pods started,
    where it stayed for the scale-down window and came down a replica every 15 s: 46 scaling
    events in the hour). A queue that fell to under DRAINING of what waited at the last interval
    is being served: the TTFT it leaves is its past (in strata sim, a batch job's 27 s p95 with 2
    of 50 left waiting doubled 8 ready replicas that had just emptied it)."""
    if seen.ttft_p95_ms is None:
        return None, ""
    ms, target = seen.ttft_p95_ms, policy.target_ttft_ms
    why = f"TTFT p95 {ms:.0f} ms {_cmp(ms, target)} target {target:.0f} ms"
    if seen.requests_waiting == 0:
        note = f" ({why} with no request waiting: prompt length, not capacity)" if ms > target else ""
        return None, note
    waiting = seen.requests_waiting
    if waiting is not None and earlier_waiting and waiting < earlier_waiting * DRAINING:
        return None, f" ({why}, a queue draining: {earlier_waiting} -> {waiting} waiting)"
    return _Term(min(ms / target, TTFT_MAX_RATIO), measured, why, queue=True), ""


def _cmp(value: float, target: float) -> str:
    return ">" if value > target else "<" if value < target else "="


def _stabilise(
    current: int, recommendation: int, policy: Policy, history: History, now: float
) -> tuple[int, str]:
    up, down = recommendation, recommendation
    for t, earlier in history.recommendations:
        if now - t <= policy.scale_up_window_s:
            up = min(up, earlier)
        if now - t <= policy.scale_down_window_s:
            down = max(down, earlier)
    result = current
    if result < up:
        result = up
    if result > down:
        result = down
    if result == recommendation:
        return result, ""
    if recommendation > current:
        return result, f"scale-up window {policy.scale_up_window_s:.0f} s"
    return result, f"scale-down window {policy.scale_down_window_s:.0f} s"


def _queue_floor(current: int, stabilised: int, note: str, history: History, now: float) -> tuple[int, str]:
    """No scale-down, within QUEUE_HOLD_S, to a replica count the service was scaled down to and
    then queued at: the load is averaged, but a queue forms in its bursts. In strata sim, premium
    at a 0.8 target went 4 -> 3 whenever the averaged load fitted 3, queued within two minutes
    for TTFTs of up to 28 s, went back up to 6, and did it four times in the hour."""
    recent = [(t, n) for t, n in history.queued if now - t < QUEUE_HOLD_S]
    if stabilised >= current or not recent:
        return stabilised, note
    when, count = max(recent, key=lambda q: q[1])
    if stabilised > count:
        return stabilised, note
    return min(count + 1, current), f"scaled down to {count} replicas, requests queued {now - when:.0f} s ago"


def _idle(seen: Observation, policy: Policy, history: History, now: float) -> bool:
    if not policy.scale_to_zero or policy.min_replicas > 0 or seen.had_traffic:
        return False
    since = history.last_traffic if history.last_traffic is not None else history.started
    return now - since >= policy.scale_to_zero_idle_s


def _bounded(why: str, current: int, target: int, policy: Policy) -> str:
    if target == current:
        return f"{why}: {current} replicas kept"
    return f"{why}: {current} -> {target} (clamped to [{policy.min_replicas}, {policy.max_replicas}])"
