"""The fleet over a GPU budget: start-up delay, scale-in by draining, waking from zero, priority
preemption with requests sent back through the router, and replica-seconds."""

from __future__ import annotations

import random

import pytest

from strata.sim.fleet import PUMP_S, Fleet
from strata.sim.router import Router
from strata.sim.run import Clock
from strata.sim.service import PodState, Service
from tests.sim.helpers import FLAT, service, trace


def fleet_of(*services: Service, gpus: int = 4) -> tuple[Fleet, Clock]:
    clock = Clock()
    return Fleet(list(services), gpus, Router(random.Random(0)), clock.at), clock


def run_until(fleet: Fleet, clock: Clock, end: float) -> None:
    while (event := clock.pop()) is not None and event[0] <= end:
        fleet.advance(event[0])
        event[1](event[0])
    fleet.advance(end)


def test_new_pods_hold_gpus_from_scheduling_and_serve_after_start_up():
    svc = service(trace((0.0, 100, 1, (1,))), replicas=1, max_replicas=4)
    fleet, clock = fleet_of(svc)
    fleet.warm_start(0.0)
    fleet.scale(svc, 2, 10.0, "test")
    assert [p.state for p in svc.pods] == [PodState.READY, PodState.STARTING]
    run_until(fleet, clock, 10.0 + FLAT.startup_s)
    assert [p.state for p in svc.pods] == [PodState.READY, PodState.READY]
    fleet.finish(100.0)
    assert svc.replica_seconds == pytest.approx(100.0 + 90.0)


def test_scale_in_drains_the_newest_pod_which_finishes_its_requests():
    svc = service(trace((0.0, 100, 1, (1,))), replicas=2, max_replicas=4)
    fleet, _clock = fleet_of(svc)
    fleet.warm_start(0.0)
    newest = svc.pods[-1]
    assert newest.engine is not None
    newest.engine.submit(svc.seq(svc.config.trace.requests[0], 0.0), 0.0)
    fleet.scale(svc, 1, 0.0, "test")
    assert newest.state is PodState.DRAINING
    fleet.advance(5.0)
    assert newest not in svc.pods and [o.result for o in svc.outcomes.items] == ["ok"]
    assert svc.replica_seconds == pytest.approx(newest.engine.clock)


def test_a_request_wakes_a_service_at_zero_and_waits_for_the_replica():
    svc = service(trace((0.0, 100, 1, (1,))), tier="batch", replicas=0, min_replicas=0)
    fleet, clock = fleet_of(svc)
    fleet.warm_start(0.0)
    assert svc.desired == 0 and not svc.pods
    fleet.arrive(svc, svc.config.trace.requests[0], 1.0)
    assert svc.desired == 1 and len(svc.gate) == 1 and svc.gate.held == 1
    run_until(fleet, clock, 100.0)
    (done,) = svc.outcomes.items
    assert done.ttft_s == pytest.approx(FLAT.startup_s + FLAT.lone_prefill_s(100))


def test_requests_past_a_replicas_slots_wait_at_the_router_and_go_as_slots_free():
    deep = FLAT.model_copy(update={"max_queue_len": 64})  # the worker would queue them all
    svc = service(trace((0.0, 100, 1, (1,))), profile=deep, replicas=1, max_replicas=1)
    fleet, clock = fleet_of(svc)
    fleet.warm_start(0.0)
    for _ in range(FLAT.max_num_seqs + 3):
        fleet.arrive(svc, svc.config.trace.requests[0], 0.0)
    (pod,) = svc.pods
    assert pod.engine is not None and pod.engine.in_flight == FLAT.max_num_seqs
    assert len(svc.gate) == 3 and svc.gate.held == 0  # queued, not held: a replica is ready
    run_until(fleet, clock, 10.0)
    assert [o.result for o in svc.outcomes.items] == ["ok"] * (FLAT.max_num_seqs + 3)
    assert not svc.gate


def test_a_service_held_at_zero_refuses_past_the_routers_hold_limit_and_time():
    svc = service(trace((0.0, 100, 1, (1,))), tier="batch", replicas=0, min_replicas=0)
    svc.wakes_on_arrival = False  # nobody wakes it: the router's limits decide
    fleet, clock = fleet_of(svc)
    fleet.warm_start(0.0)
    hold = svc.gate.limits
    for _ in range(hold.hold_max + 2):
        fleet.arrive(svc, svc.config.trace.requests[0], 0.0)
    assert svc.desired == 0 and svc.gate.held == hold.hold_max
    assert [o.result for o in svc.outcomes.items] == ["hold_full"] * 2
    run_until(fleet, clock, hold.hold_s + 2 * PUMP_S)
    assert not svc.gate and len(svc.outcomes.items) == hold.hold_max + 2
    assert {o.result for o in svc.outcomes.items[2:]} == {"hold_timeout"}


def test_a_premium_pod_preempts_a_batch_pod_whose_requests_are_retried():
    batch = service(trace((0.0, 3000, 200, tuple(range(30)))), tier="batch", replicas=2, max_replicas=2)
    premium = service(trace((0.0, 100, 1, (1,))), tier="premium", replicas=1, max_replicas=2)
    fleet, clock = fleet_of(premium, batch, gpus=3)
    fleet.warm_start(0.0)
    victim = batch.pods[-1]
    assert victim.engine is not None
    victim.engine.submit(batch.seq(batch.config.trace.requests[0], 0.0), 0.0)
    fleet.advance(0.05)
    fleet.scale(premium, 2, 0.05, "test")
    assert victim not in batch.pods and batch.pod_preemptions == 1 and batch.retried == 1
    assert len(batch.in_state(PodState.PENDING)) == 1  # its controller wants it back
    run_until(fleet, clock, 200.0)
    assert [o.result for o in batch.outcomes.items] == ["ok"]


def test_the_router_sends_a_repeated_prefix_to_the_replica_holding_it():
    prompts = [(0.0, 2000, 2, tuple(range(k * 100, k * 100 + 20))) for k in range(4)]
    svc = service(trace(*prompts), replicas=4, max_replicas=4)
    fleet, clock = fleet_of(svc)
    fleet.warm_start(0.0)
    for request in svc.config.trace.requests:  # one each: the load spreads them
        fleet.arrive(svc, request, 0.0)
    run_until(fleet, clock, 10.0)
    assert all(p.engine is not None and p.engine.tally.prompt_tokens == 2000 for p in svc.pods)
    for request in svc.config.trace.requests:
        fleet.arrive(svc, request, 10.0)
    run_until(fleet, clock, 20.0)
    assert [dict(o.hit_tokens)["hbm"] for o in svc.outcomes.items[4:]] == [1900] * 4
