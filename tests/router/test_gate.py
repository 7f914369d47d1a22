"""The gate: free slots go straight to the choice; otherwise priority order, the queue's TTL and
length (429 with Retry-After), and holding while no replica is ready (503, counted)."""

from __future__ import annotations

import asyncio
import random

import pytest

from strata.router.choose import Prompt
from strata.router.config import RouterConfig
from strata.router.fleet import Address, Fleet
from strata.router.gate import Gate, Refused


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(
    endpoints: int = 1, inflight: int = 1, ttl: float = 5.0, max_len: int = 8, hold_s: float = 5.0, **kw
):
    config = RouterConfig.model_validate(
        {
            "model": {"name": "m", "max_context_tokens": 1024},
            "queue": {"max_inflight_per_endpoint": inflight, "ttl_s": ttl, "max_len": max_len},
            "hold": {"timeout_s": hold_s, "max_requests": kw.pop("hold_max", 4)},
            **kw,
        }
    )
    fleet = Fleet(inflight, 100)
    for i in range(endpoints):
        fleet.add(f"e{i}", Address(f"http://127.0.0.1:{9000 + i}", {}))
    clock = Clock()
    return Gate(config, fleet, random.Random(0), clock), fleet, clock


PROMPT = Prompt([b"a" * 16], 40, 16)


async def test_a_free_slot_is_taken_at_once_and_given_back():
    gate, fleet, _ = make()
    route = await gate.enter(PROMPT, 0)
    assert [e.name for e in route.endpoints] == ["e0"] and route.queued_s == 0
    assert fleet.endpoints["e0"].inflight == 1
    gate.finished(route.endpoints[0])
    assert fleet.endpoints["e0"].inflight == 0


async def test_waiters_go_highest_priority_first_then_in_arrival_order():
    gate, _, _ = make()
    first = await gate.enter(PROMPT, 0)
    order: list[str] = []

    async def wait(name: str, priority: int) -> None:
        route = await gate.enter(PROMPT, priority)
        order.append(name)
        gate.finished(route.endpoints[0])

    tasks = [asyncio.create_task(wait(n, p)) for n, p in (("low", 1), ("high", 5), ("low2", 1))]
    await asyncio.sleep(0)
    assert gate.queued() == 3
    gate.finished(first.endpoints[0])
    await asyncio.gather(*tasks)
    assert order == ["high", "low", "low2"]


async def test_a_request_waiting_past_the_ttl_gets_429_with_retry_after():
    gate, _, _ = make(ttl=0.05)
    await gate.enter(PROMPT, 0)
    with pytest.raises(Refused) as refused:
        await gate.enter(PROMPT, 0)
    assert refused.value.status == 429 and refused.value.reason == "queue_ttl"
    assert refused.value.retry_after_s >= 1
    assert gate.queued() == 0


async def test_a_full_queue_refuses_at_once():
    gate, _, _ = make(max_len=1)
    await gate.enter(PROMPT, 0)
    waiting = asyncio.create_task(gate.enter(PROMPT, 0))
    await asyncio.sleep(0)
    with pytest.raises(Refused, match="queue is full") as refused:
        await gate.enter(PROMPT, 0)
    assert refused.value.status == 429
    waiting.cancel()


async def test_a_predicted_wait_past_the_ttl_is_refused_up_front_not_late():
    gate, _, _ = make(ttl=5.0)
    route = await gate.enter(PROMPT, 0)
    gate.finished(route.endpoints[0])  # one completion in the last 30 s: ~0.03 per second
    await gate.enter(PROMPT, 0)
    with pytest.raises(Refused, match="would hold this request about") as refused:
        await gate.enter(PROMPT, 0)
    assert refused.value.status == 429 and refused.value.retry_after_s > 5


async def test_requests_are_held_while_no_replica_is_ready_and_go_when_one_is():
    gate, fleet, _ = make(hold_s=30)
    fleet.endpoints["e0"].ready = False
    held = asyncio.create_task(gate.enter(PROMPT, 0))
    await asyncio.sleep(0)
    assert gate.held() == 1 and gate.queued() == 0
    fleet.endpoints["e0"].ready = True
    gate.dispatch()
    route = await held
    assert route.endpoints[0].name == "e0" and gate.held() == 0


async def test_holding_is_bounded_in_number_and_time():
    gate, fleet, _ = make(hold_s=0.05, hold_max=1)
    fleet.endpoints["e0"].terminating = True
    first = asyncio.create_task(gate.enter(PROMPT, 0))
    await asyncio.sleep(0)
    with pytest.raises(Refused, match="already held") as full:
        await gate.enter(PROMPT, 0)
    assert full.value.status == 503
    with pytest.raises(Refused, match="no replica became ready") as late:
        await first
    assert late.value.status == 503 and late.value.reason == "hold_timeout"


async def test_a_caller_who_leaves_while_waiting_frees_its_place():
    gate, fleet, _ = make()
    route = await gate.enter(PROMPT, 0)
    waiting = asyncio.create_task(gate.enter(PROMPT, 0))
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert gate.queued() == 0
    gate.finished(route.endpoints[0])
    assert fleet.endpoints["e0"].inflight == 0


async def test_round_robin_ignores_caches_and_rotates():
    gate, _, _ = make(endpoints=3, inflight=10, policy="round-robin")
    firsts = []
    for _ in range(6):
        route = await gate.enter(PROMPT, 0)
        firsts.append(route.endpoints[0].name)
        gate.finished(route.endpoints[0])
    assert firsts == ["e0", "e1", "e2", "e0", "e1", "e2"]
