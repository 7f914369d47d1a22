"""The built-in autoscaler's decision, one rule at a time; and which peering replica acts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from strata.operator.autoscale.decide import History, Observation, Policy, _tier_spec, backlog, decide
from strata.operator.autoscale.peering import is_active
from strata.operator.autoscale.signals import Aggregate

NO_WINDOWS = Policy(
    target_kv_cache_usage=0.75,
    target_ttft_ms=300,
    tolerance=0.1,
    scale_up_window_s=0,
    scale_down_window_s=0,
    max_scale_up_step=4,
    max_scale_down_step=4,
    min_replicas=1,
    max_replicas=10,
)


def seen(
    kv: float | None = None,
    ttft: float | None = None,
    traffic: bool = True,
    prefill: float | None = None,
    waiting: int | None = None,
) -> Observation:
    return Observation(
        kv_cache_usage=kv,
        ttft_p95_ms=ttft,
        had_traffic=traffic,
        prefill_utilization=prefill,
        requests_waiting=waiting,
    )


def fresh(now: float = 0.0) -> History:
    return History(started=now)


def test_ttft_over_target_scales_up_by_the_ratio_at_most_doubling_with_the_numbers_in_the_reason():
    d = decide(4, seen(kv=0.5, ttft=450), NO_WINDOWS, fresh(), 100)
    # ratio 450 / 300 = 1.5 beats 0.5 / 0.75: ceil(4 * 1.5) = 6.
    assert d.replicas == 6 and d.recommendation == 6
    assert d.reason == "TTFT p95 450 ms > target 300 ms: 4 -> 6"
    # 812 / 300 = 2.71, but a queue's TTFT says the replicas are short, not by how much: double.
    d = decide(2, seen(kv=0.5, ttft=812), NO_WINDOWS, fresh(), 100)
    assert d.replicas == 4 and d.recommendation == 4
    assert d.reason == "TTFT p95 812 ms > target 300 ms: 2 -> 4"


def test_a_queue_of_seconds_doubles_the_ready_replicas_and_pods_still_starting_are_not_multiplied():
    """strata sim, premium at a 0.8 target: 3 replicas queued for a TTFT p95 of 26 s; the old
    ratio (87x) asked for 262, and every interval of the new pods' start-up asked for more, up to
    maxReplicas."""
    policy = Policy(**{**NO_WINDOWS.__dict__, "max_replicas": 16})
    queue = Observation(0.99, 26143, True, requests_waiting=34, ready_replicas=3)
    d = decide(3, queue, policy, fresh(), 105)
    assert d.recommendation == 6 and d.replicas == 6
    # 15 s later: still 3 ready (the new pods take a minute), still queued: 6 are coming, enough.
    later = Observation(0.99, 28684, True, requests_waiting=22, ready_replicas=3)
    d = decide(6, later, policy, fresh(), 120)
    assert d.recommendation == 6 and d.replicas == 6 and not d.changes(6)


def test_the_ttft_a_draining_queue_leaves_behind_does_not_scale():
    """strata sim, a batch job woken from zero (cpu profile): 8 ready replicas had just served a
    queue of 50 down to 2; the interval's p95 of 27 s, those requests' past, doubled them to 16."""
    history = fresh()
    history.record(1245, 8, True, keep_s=0, ttft_ms=27585, waiting=50)
    drained = Observation(0.01, 27412, True, requests_waiting=2, ready_replicas=8)
    d = decide(8, drained, NO_WINDOWS, history, 1260)
    assert d.recommendation == 1 and d.reason.startswith("kvCacheUsage 0.01 < target 0.75")
    assert "(TTFT p95 27412 ms > target 300 ms, a queue draining: 50 -> 2 waiting)" in d.reason
    # Half or more still waiting: the queue is not being served; the TTFT counts.
    history.record(1245, 8, True, keep_s=0, ttft_ms=27585, waiting=4)
    assert (
        decide(8, drained, Policy(**{**NO_WINDOWS.__dict__, "max_replicas": 16}), history, 1260).replicas
        == 12
    )


def test_kv_usage_scales_the_ready_pods_it_was_measured_on():
    # 3 of 6 ready, at 0.99 against 0.75: ceil(3 * 1.32) = 4 replicas' worth, not ceil(6 * 1.32) = 8.
    starting = Observation(0.99, None, True, ready_replicas=3)
    assert decide(6, starting, NO_WINDOWS, fresh(), 100).recommendation == 4
    # The scale-down window keeps the pods that were asked for while they start.
    policy = Policy(**{**NO_WINDOWS.__dict__, "scale_down_window_s": 180})
    history = fresh()
    history.record(90, 6, True, keep_s=180)
    d = decide(6, starting, policy, history, 100)
    assert d.replicas == 6 and "scale-down window 180 s" in d.reason


def test_a_woken_service_takes_the_step_while_more_requests_are_held_than_its_starting_pods_take():
    policy = Policy(**{**NO_WINDOWS.__dict__, "slots_per_replica": 8})
    starting = Observation(None, None, True, ready_replicas=0, requests_held=20)
    d = decide(2, starting, policy, fresh(), 100)
    assert d.replicas == 6
    assert d.reason == "20 requests held at the router, no replica ready: 2 -> 6 (max step 4)"
    assert decide(3, starting, policy, fresh(), 100).replicas == 3  # 24 slots take the 20: wait
    up = Observation(None, None, True, ready_replicas=1, requests_held=20)  # a replica serves: measure
    assert decide(2, up, policy, fresh(), 100).replicas == 2
    assert backlog(9, 1000, policy) == 10  # clamped to maxReplicas
    assert backlog(10, 1000, policy) is None


def test_kv_usage_over_target_scales_up():
    d = decide(2, seen(kv=0.95), NO_WINDOWS, fresh(), 100)
    assert d.replicas == 3 and d.reason == "kvCacheUsage 0.95 > target 0.75: 2 -> 3"


def test_prefill_utilization_sizes_like_cpu_utilization_in_an_hpa():
    policy = Policy(**{**NO_WINDOWS.__dict__, "target_prefill_utilization": 0.2})
    d = decide(4, seen(kv=0.1, prefill=0.5), policy, fresh(), 100)
    # 0.5 / 0.2 = 2.5: ceil(4 * 2.5) = 10, capped by the step of 4.
    assert d.recommendation == 10 and d.replicas == 8
    assert d.reason == "prefillUtilization 0.50 > target 0.20: 4 -> 8 (max step 4)"


def test_prefill_utilization_is_averaged_over_its_window():
    policy = Policy(**{**NO_WINDOWS.__dict__, "target_prefill_utilization": 0.2})
    history = fresh()
    for t in (40, 55, 70, 85):
        history.record(t, 4, True, keep_s=0, busy=0.4)
    history.record(-100, 4, True, keep_s=0, busy=3.6)  # outside the 120 s window: dropped
    # (0.1 * 4 + 0.5) / 5 = 0.18: within the tolerance of 0.2, one spiky interval changes nothing.
    d = decide(4, seen(prefill=0.5), policy, history, 100)
    assert d.replicas == 4 and "prefillUtilization 0.18 < target 0.20" in d.reason
    # The operator's window setting: a 30 s one keeps only the interval at 85 s.
    short = History(started=0, utilization_window_s=30)
    for t in (40, 55, 70, 85):
        short.record(t, 4, True, keep_s=0, busy=0.4)
    assert "prefillUtilization 0.30 > target 0.20" in decide(4, seen(prefill=0.5), policy, short, 100).reason


def test_the_load_is_averaged_not_the_utilization_of_another_replica_count():
    policy = Policy(**{**NO_WINDOWS.__dict__, "target_prefill_utilization": 0.2, "max_replicas": 16})
    history = fresh()
    for t in (40, 55, 70, 85):  # 4 replicas at 0.8: 3.2 replicas' worth of prompts
        history.record(t, 16, True, keep_s=0, busy=3.2)
    # 16 wanted, 4 of them ready and measured at 0.8: the load is still 3.2 replicas' worth,
    # 0.2 each over 16, not 0.8 x 16 = 12.8 of them.
    starting = Observation(None, None, True, prefill_utilization=0.8, prefill_busy=3.2, ready_replicas=4)
    d = decide(16, starting, policy, history, 100)
    assert d.replicas == 16 and "prefillUtilization 0.20 = target 0.20" in d.reason
    # Less load later: 2.4 replicas' worth over 16 is 0.15, ceil(16 x 0.75) = 12.
    assert decide(16, Observation(None, None, True, 0.15, 2.4), policy, fresh(), 100).replicas == 12


def test_a_slow_ttft_without_a_queue_does_not_scale_but_is_named():
    d = decide(4, seen(kv=0.3, ttft=2400, waiting=0), NO_WINDOWS, fresh(), 100)
    assert d.replicas == 2  # the KV usage decides: 0.3 / 0.75 -> ceil(4 * 0.4) = 2
    assert (
        "(TTFT p95 2400 ms > target 300 ms with no request waiting: prompt length, not capacity)" in d.reason
    )
    queued = decide(4, seen(kv=0.3, ttft=2400, waiting=3), NO_WINDOWS, fresh(), 100)
    assert queued.replicas == 8 and queued.reason.startswith("TTFT p95 2400 ms > target 300 ms")


def test_within_tolerance_nothing_changes():
    d = decide(4, seen(kv=0.8, ttft=310), NO_WINDOWS, fresh(), 100)
    assert d.replicas == 4 and not d.changes(4)
    assert "within tolerance 0.1" in d.reason


def test_low_load_scales_down():
    d = decide(4, seen(kv=0.3, ttft=30), NO_WINDOWS, fresh(), 100)
    assert d.replicas == 2 and d.reason.startswith("kvCacheUsage 0.30 < target 0.75: 4 -> 2")


def test_max_step_up_and_down():
    policy = Policy(**{**NO_WINDOWS.__dict__, "max_scale_up_step": 2, "max_scale_down_step": 1})
    up = decide(2, seen(kv=0.75 * 5), policy, fresh(), 100)
    assert up.replicas == 4 and up.recommendation == 10 and "(max step 2)" in up.reason
    down = decide(8, seen(kv=0.1), policy, fresh(), 100)
    assert down.replicas == 7 and "(max step 1)" in down.reason


def test_bounds_clamp_the_result():
    policy = Policy(**{**NO_WINDOWS.__dict__, "min_replicas": 3, "max_replicas": 5})
    up = decide(4, seen(ttft=3000), policy, fresh(), 100)
    assert up.replicas == 5 and "clamped to [3, 5]" in up.reason
    down = decide(4, seen(kv=0.1), policy, fresh(), 100)
    assert down.replicas == 3


def test_scale_down_waits_for_the_highest_recommendation_in_its_window():
    policy = Policy(**{**NO_WINDOWS.__dict__, "scale_down_window_s": 300})
    history = fresh()
    history.record(50, 6, True, keep_s=300)  # a peak 50 s ago
    d = decide(6, seen(kv=0.2), policy, history, 100)
    assert d.replicas == 6 and d.recommendation == 2 and "scale-down window 300 s" in d.reason
    # Once the peak is out of the window, down it goes (by the step).
    later = decide(6, seen(kv=0.2), policy, history, 351)
    assert later.replicas == 2


def test_scale_up_goes_only_to_the_lowest_recommendation_in_its_window():
    policy = Policy(**{**NO_WINDOWS.__dict__, "scale_up_window_s": 60})
    history = fresh()
    history.record(70, 3, True, keep_s=60)
    d = decide(2, seen(kv=0.75 * 4), policy, history, 100)
    assert d.recommendation == 8 and d.replicas == 3 and "scale-up window 60 s" in d.reason


def test_an_interval_without_signals_does_not_vote_in_the_scale_up_window():
    policy = Policy(**{**NO_WINDOWS.__dict__, "scale_up_window_s": 60})
    history = fresh()
    blind = decide(2, seen(), policy, history, 70)  # no first token, no gauge: nothing to go on
    assert blind.replicas == 2 and blind.recommendation is None
    history.record(70, blind.recommendation, True, keep_s=60)
    d = decide(2, seen(kv=0.75 * 2), policy, history, 100)
    assert d.recommendation == 4 and d.replicas == 4  # not held at 2 by the blind interval


def test_a_queue_without_a_first_token_keeps_the_last_ttft_in_the_scale_up_window():
    policy = Policy(**{**NO_WINDOWS.__dict__, "scale_up_window_s": 60, "max_scale_up_step": 4})
    history = fresh()
    first = decide(1, seen(kv=0.1, ttft=3000, waiting=4), policy, history, 70)
    history.record(70, first.recommendation, True, keep_s=60, ttft_ms=3000)
    # long generations hold every slot: no first token in this interval, four still waiting
    stuck = decide(2, seen(kv=0.1, waiting=4), policy, history, 100)
    assert first.recommendation == 2  # 3000 ms over a 300 ms target: double
    assert stuck.recommendation == 4 and "TTFT p95 3000 ms" in stuck.reason
    assert stuck.replicas == 2  # the scale-up window: the lowest of its recommendations
    drained = decide(1, seen(kv=0.1, waiting=0), policy, history, 130)  # the queue emptied
    assert drained.recommendation == 1


QUEUED = Policy(**{**NO_WINDOWS.__dict__, "max_scale_down_step": 1, "max_replicas": 16})


def scaled(history: History, current: int, observation: Observation, now: float) -> int:
    """One interval of the loop: decide, then record what the loop records."""
    d = decide(current, observation, QUEUED, history, now)
    history.record(
        now,
        d.recommendation,
        True,
        QUEUED.keep_s,
        None,
        observation.ttft_p95_ms,
        d.queued,
        d.down_to(current),
        observation.requests_waiting,
    )
    return d.replicas


def test_no_scale_down_again_to_a_count_that_was_scaled_down_to_and_then_queued():
    """strata sim, premium at a 0.8 target: 4 -> 3 whenever the averaged load fitted 3, a queue
    at 3 within two minutes, back up to 6; four times in the hour."""
    history = fresh()
    light = Observation(0.2, 2000, True, requests_waiting=0, ready_replicas=4)  # 0.2 / 0.75: 2 enough
    assert scaled(history, 4, light, 15) == 3
    queue = Observation(0.9, 26000, True, requests_waiting=30, ready_replicas=3)
    d = decide(3, queue, QUEUED, history, 105)
    assert (d.replicas, d.queued) == (6, 3)
    assert scaled(history, 3, queue, 105) == 6
    quiet = Observation(0.1, 2000, True, requests_waiting=0, ready_replicas=6)  # 1 would do
    assert scaled(history, 6, quiet, 300) == 5
    assert scaled(history, 5, quiet, 315) == 4
    d = decide(4, quiet, QUEUED, history, 330)
    assert d.replicas == 4 and d.reason.endswith("(scaled down to 3 replicas, requests queued 225 s ago)")
    assert decide(4, quiet, QUEUED, history, 105 + 600).replicas == 3  # the hold is over


def test_a_queue_that_no_scale_down_led_to_leaves_no_floor():
    history = fresh()  # e.g. a batch job's burst at the replicas it was woken with
    queue = Observation(0.9, 26000, True, requests_waiting=30, ready_replicas=3)
    d = decide(3, queue, QUEUED, history, 105)
    assert d.replicas == 6 and d.queued is None
    history.record(105, d.recommendation, True, QUEUED.keep_s, None, 26000, d.queued, d.down_to(3))
    assert decide(6, Observation(0.1, 2000, True, requests_waiting=0), QUEUED, history, 300).replicas == 5
    assert decide(4, Observation(0.1, 2000, True, requests_waiting=0), QUEUED, history, 315).replicas == 3


def test_no_signals_keep_the_replicas_within_bounds():
    assert decide(3, seen(), NO_WINDOWS, fresh(), 100).replicas == 3
    policy = Policy(**{**NO_WINDOWS.__dict__, "max_replicas": 2})
    assert decide(3, seen(), policy, fresh(), 100).replicas == 2


ZERO = Policy(
    **{**NO_WINDOWS.__dict__, "min_replicas": 0, "scale_to_zero": True, "scale_to_zero_idle_s": 600}
)


def test_scale_to_zero_after_the_idle_window_when_allowed():
    history = fresh(0)
    history.record(100, 1, True, keep_s=0)  # last request at t=100
    assert decide(1, seen(kv=0.0, traffic=False), ZERO, history, 650).replicas == 1  # idle 550 s
    d = decide(1, seen(kv=0.0, traffic=False), ZERO, history, 700)
    assert d.replicas == 0 and d.reason == "no traffic for 600 s >= scaleToZeroIdleSeconds 600: 1 -> 0"


def test_traffic_in_the_interval_prevents_scale_to_zero():
    assert decide(1, seen(kv=0.0, traffic=True), ZERO, fresh(0), 10_000).replicas == 1


def test_a_woken_service_is_not_idle_while_no_replica_is_ready():
    """Woken at t=0 (requests held at its router), its pod still starting at t=40: back to zero
    now would strand the held requests. The idle clock runs from when a replica is ready."""
    history = fresh(0)
    idle = Aggregate(kv_cache_usage=None, ttft_p95_s=None, requests_waiting=None)
    starting = Observation.of(idle, ready_replicas=0)
    zero_30 = Policy(**{**ZERO.__dict__, "scale_to_zero_idle_s": 30})
    assert decide(1, starting, zero_30, history, 40).replicas == 1
    history.record(40, 1, starting.had_traffic, keep_s=0)
    served = Observation.of(idle, ready_replicas=1)
    assert decide(1, served, zero_30, history, 60).replicas == 1  # idle 20 s since it was ready
    assert decide(1, served, zero_30, history, 70).replicas == 0


def test_scale_to_zero_forbidden_by_the_tier_or_by_min_replicas():
    forbidden = Policy(**{**ZERO.__dict__, "scale_to_zero": False})
    assert decide(1, seen(kv=0.0, traffic=False), forbidden, fresh(0), 10_000).replicas == 1
    min_one = Policy(**{**ZERO.__dict__, "min_replicas": 1})
    assert decide(1, seen(kv=0.0, traffic=False), min_one, fresh(0), 10_000).replicas == 1
    # The ratio alone never reaches zero, even where zero is allowed.
    assert decide(1, seen(kv=0.0, traffic=True), ZERO, fresh(0), 100).replicas == 1


def test_policy_takes_the_tier_targets_and_the_narrower_bounds():
    tier = {
        "slo": {"ttftP95Ms": 250},
        "autoscaling": {
            "targetKvCacheUsage": 0.8,
            "targetPrefillUtilization": 0.25,
            "maxReplicas": 6,
            "minReplicas": 1,
            "maxScaleUpStep": 2,
        },
    }
    policy = Policy.of(tier, {"minReplicas": 2, "maxReplicas": 10})
    assert policy.target_ttft_ms == 250 and policy.target_kv_cache_usage == 0.8
    assert policy.target_prefill_utilization == 0.25
    assert (policy.min_replicas, policy.max_replicas, policy.max_scale_up_step) == (2, 6, 2)
    assert Policy.of(None, {}).target_kv_cache_usage == 0.75


def test_policy_refuses_a_bad_tier_naming_the_field():
    for _ in range(2):  # a refusal is not remembered: it is raised every time
        with pytest.raises(ValueError, match=r"targetKvCacheUsage|target_kv_cache_usage"):
            Policy.of({"autoscaling": {"targetKvCacheUsage": 2}}, {})


def test_a_tier_is_parsed_once_per_content_whatever_the_service():
    tier = {"slo": {"ttftP95Ms": 321}, "autoscaling": {"maxReplicas": 5}}
    first = Policy.of(tier, {"maxReplicas": 3})
    hits = _tier_spec.cache_info().hits
    again = Policy.of(dict(reversed(list(tier.items()))), {"maxReplicas": 9})  # same content
    assert _tier_spec.cache_info().hits == hits + 1
    assert (first.max_replicas, again.max_replicas, again.target_ttft_ms) == (3, 5, 321)


NOW = datetime(2026, 1, 1, tzinfo=UTC)


def peer(priority: int, age_s: float, lifetime: int = 60) -> dict[str, object]:
    return {
        "priority": priority,
        "lifetime": lifetime,
        "lastseen": (NOW - timedelta(seconds=age_s)).isoformat(),
    }


def test_the_highest_live_priority_is_active():
    peers = {"me": peer(10, 1), "other": peer(5, 1)}
    assert is_active(peers, 10, NOW) and not is_active(peers, 5, NOW)


def test_a_dead_higher_peer_does_not_pause_us():
    assert is_active({"me": peer(5, 1), "dead": peer(10, 120)}, 5, NOW)


def test_equal_priorities_pause_everyone_and_absence_means_not_active():
    assert not is_active({"me": peer(7, 1), "twin": peer(7, 1)}, 7, NOW)
    assert not is_active({}, 7, NOW)
