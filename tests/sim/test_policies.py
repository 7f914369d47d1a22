"""Each scaling policy on hand-made situations: the builtin one through the operator's own
signals and decide, the peers by their published rules."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from strata.sim.engine import Engine
from strata.sim.fleet import Fleet
from strata.sim.policies.base import View
from strata.sim.policies.builtin import Builtin
from strata.sim.policies.catalog import Knobs, factory
from strata.sim.policies.kpa import Kpa, KpaSettings
from strata.sim.policies.planner import Planner, decode_tokens_per_s
from strata.sim.policies.saturation import Saturation
from strata.sim.requests import TTFT_BUCKETS, Seq
from strata.sim.router import Router
from strata.sim.run import Clock
from strata.sim.service import PodState, Service
from tests.sim.helpers import FLAT, service, trace


def ready_service(replicas: int, tier: str = "premium", **config: Any) -> Service:
    svc = service(trace((0.0, 100, 1, (1,))), tier=tier, replicas=replicas, max_replicas=16, **config)
    Fleet([svc], 64, Router(random.Random(0)), Clock().at).warm_start(0.0)
    return svc


def engines(svc: Service) -> list[Engine]:
    return [p.engine for p in svc.in_state(PodState.READY) if p.engine is not None]


def test_builtin_primes_then_scales_up_on_ttft_with_the_operators_reason():
    svc = ready_service(1)
    policy = Builtin(svc)
    assert policy.decide(View(svc, 0.0)) is None  # the first interval only primes
    (engine,) = engines(svc)
    slow = TTFT_BUCKETS.index(2.5)
    engine.tally.ttft_counts[slow] += 20  # twenty first tokens between 1 and 2.5 s
    engine.tally.first_tokens += 20
    engine.tally.prompt_tokens += 2000
    request = svc.config.trace.requests[0]
    engine.waiting.extend(Seq(request, (), 15.0) for _ in range(3))  # and requests queue for it
    verdict = policy.decide(View(svc, 15.0))
    # 8x premium's target, but a queue's TTFT says the replicas are short, not by how much: double
    assert verdict is not None and verdict.replicas == 2
    assert verdict.reason.startswith("TTFT p95 2425 ms > target 300 ms: 1 -> 2")


def test_builtin_ignores_a_slow_ttft_when_nobody_waits_and_sizes_on_prefill_utilization():
    svc = ready_service(4)
    policy = Builtin(svc)
    policy.decide(View(svc, 0.0))
    for engine in engines(svc):
        engine.tally.ttft_counts[TTFT_BUCKETS.index(2.5)] += 20  # long prompts: slow, but no queue
        engine.tally.first_tokens += 20
        engine.tally.prompt_tokens += 2000
        engine.tally.prefill_busy_s += 0.9  # 6% of the 15 s interval: below premium's target
    verdict = policy.decide(View(svc, 15.0))
    assert verdict is not None and verdict.replicas == 3  # down by premium's step of 1
    assert "prefillUtilization 0.06 < target" in verdict.reason
    assert "with no request waiting: prompt length, not capacity" in verdict.reason


def test_builtin_takes_the_tier_policy_and_the_service_bounds():
    svc = ready_service(2, tier="batch", min_replicas=0)
    policy = Builtin(svc)
    assert policy.policy.target_kv_cache_usage == 0.9 and policy.policy.max_replicas == 16
    assert policy.policy.scale_to_zero and policy.policy.min_replicas == 0


def test_builtin_keeps_a_woken_service_whose_pod_starts_for_longer_than_the_idle_window():
    svc = service(trace((0.0, 100, 1, (1,))), tier="batch", replicas=0, min_replicas=0, max_replicas=16)
    Fleet([svc], 64, Router(random.Random(0)), Clock().at).scale(svc, 1, 0.0, "woken")
    policy = Builtin(svc)  # no pod ready, no request held: idle by the counters alone
    verdicts = [policy.decide(View(svc, float(t))) for t in range(0, 1201, 15)]
    assert svc.desired == 1 and all(v is None or v.replicas == 1 for v in verdicts)


def test_builtin_wakes_a_service_at_zero_from_its_loop_by_the_requests_held():
    svc = service(trace((0.0, 100, 1, (1,))), tier="batch", replicas=0, min_replicas=0, max_replicas=16)
    policy = Builtin(svc)
    fleet = Fleet([svc], 64, Router(random.Random(0)), Clock().at)
    svc.wakes_on_arrival = policy.wakes_on_arrival
    fleet.warm_start(0.0)
    assert policy.decide(View(svc, 0.0)) is None  # at zero, nothing held: scraped, left alone
    request = svc.config.trace.requests[0]
    fleet.arrive(svc, request, 1.0)
    assert svc.desired == 0 and svc.gate.held == 1  # the router holds it; nobody scaled yet
    verdict = policy.decide(View(svc, 15.0))
    assert verdict is not None and verdict.replicas == 1
    assert verdict.reason == "1 requests held at the router while at zero: 0 -> 1"
    fleet.scale(svc, verdict.replicas, 15.0, verdict.reason)
    for _ in range(FLAT.max_num_seqs):  # more than its one starting replica takes in flight
        fleet.arrive(svc, request, 20.0)
    verdict = policy.decide(View(svc, 30.0))
    assert verdict is not None and verdict.replicas == 9  # batch's scale-up step of 8
    assert verdict.reason.startswith(f"{FLAT.max_num_seqs + 1} requests held at the router, no replica ready")


def test_kv_threshold_adds_one_when_spare_kv_runs_low_but_not_while_one_starts():
    svc = ready_service(2)
    policy = Saturation()
    policy.since = -60.0
    busy = [(0.75, 0.0), (0.72, 0.0)]  # mean spare KV 0.065 < 0.1
    assert policy._verdict(View(svc, 0.0), busy).replicas == 3  # type: ignore[union-attr]
    svc.new_pod(0.0)  # a pod pending: the cascade guard holds further scale-up
    assert policy._verdict(View(svc, 0.0), busy) is None


def test_kv_threshold_removes_one_only_when_the_rest_keeps_its_spare():
    svc = ready_service(3)
    policy = Saturation()
    assert policy._verdict(View(svc, 0.0), [(0.1, 0.0)] * 3).replicas == 2  # type: ignore[union-attr]
    assert policy._verdict(View(svc, 0.0), [(0.5, 0.0)] * 3) is None  # 0.75 each after: spare 0.05


def test_kpa_follows_concurrency_over_its_stable_window_and_panics_on_a_burst():
    svc = ready_service(2)
    kpa = Kpa(KpaSettings(target=5.0), scale_to_zero=False)
    first, _second = engines(svc)
    request = svc.config.trace.requests[0]
    first.waiting.extend(Seq(request, (), 0.0) for _ in range(20))
    verdict = kpa.decide(View(svc, 0.0))
    assert verdict is not None and verdict.reason.startswith("panic")
    assert verdict.replicas == 6  # ceil(20 / (5 * 0.7))


def test_kpa_scales_down_at_most_by_half_per_tick():
    svc = ready_service(8)
    kpa = Kpa(KpaSettings(target=5.0), scale_to_zero=False)
    verdict = kpa.decide(View(svc, 100.0))
    assert verdict is not None and verdict.replicas == 4


def test_planner_sizes_prefill_and_decode_from_the_profile():
    svc = ready_service(1)
    for i in range(180):  # one request per second of 1,000 in / 10 out over the interval
        svc.arrivals.append((float(i), 1000, 10))
    verdict = Planner(svc).decide(View(svc, 180.0))
    assert verdict is not None
    # 1,000 prompt tokens/s over what one replica prefills per second; 10 decode tokens/s over
    # what one replica decodes at the premium ITL target (50 ms) at context 1,000 + 10 / 2.
    prefill = 1000 / (1000 / FLAT.lone_prefill_s(1000))
    decode = 10 / decode_tokens_per_s(FLAT, 0.050, 1005)
    assert verdict.replicas == math.ceil(prefill + decode)


def test_static_policies_need_their_sizes():
    svc = ready_service(1)
    with pytest.raises(ValueError, match="no replica count sized"):
        factory("static_peak", Knobs())(svc)
    static = factory("static_mean", Knobs(static={"static_mean": {svc.name: 3}}))(svc)
    assert static.decide(View(svc, 0.0)).replicas == 3  # type: ignore[union-attr]


def test_an_unknown_policy_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown 'hpa'"):
        factory("hpa", Knobs())
