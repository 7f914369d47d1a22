"""The router's look-ahead: requests waiting in its queue are announced to the sidecar of the
replica each is expected at, as a whole set and then changes to it (the whole set again for a
sidecar that cannot take a change), resent while they wait and cleared when they go."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from bench import routing_lookahead
from strata.common.endpoints import EXPECT_PATH
from strata.router import announce
from strata.router.announce import RESEND_S, Announcer, Sent, due, message, plan
from strata.router.choose import Prompt
from strata.router.config import RouterConfig
from strata.router.fleet import Address, Fleet
from strata.router.gate import Gate, Queued
from strata.worker.kvtier.metrics import TierMetrics, serve_http
from strata.worker.kvtier.service import KVTierService

BLOCK_TOKENS = 16


def key(n: int) -> bytes:
    return n.to_bytes(16, "big")


def hexes(*ns: int) -> list[str]:
    return [key(n).hex() for n in ns]


def prompt(*ns: int) -> Prompt:
    """Full blocks ``ns`` and one more token: every block is usable."""
    return Prompt([key(n) for n in ns], len(ns) * BLOCK_TOKENS + 1, BLOCK_TOKENS)


def test_each_endpoint_gets_the_requests_expected_there_nearest_first():
    queue = [
        Queued("q1", prompt(1, 2), "e0"),
        Queued("q2", prompt(3), "e1"),
        Queued("q3", prompt(4), "e0"),
        Queued("q4", prompt(5), "gone"),  # its endpoint left: not announced anywhere
    ]
    sets = plan(queue, ["e0", "e1", "e2"])
    assert sets == {"e0": {"q1": hexes(1, 2), "q3": hexes(4)}, "e1": {"q2": hexes(3)}, "e2": {}}
    assert list(sets["e0"]) == ["q1", "q3"]
    # The block holding the prompt's last token is not announced: no cache serves it.
    partial = Prompt([key(1), key(2)], 2 * BLOCK_TOKENS, BLOCK_TOKENS)
    assert plan([Queued("q", partial, "e0")], ["e0"]) == {"e0": {"q": hexes(1)}}


def test_an_endpoints_set_stops_where_its_sidecar_would(monkeypatch):
    monkeypatch.setattr(announce, "MAX_EXPECTED_BLOCKS", 3)
    queue = [
        Queued("q1", prompt(1, 2), "e0"),
        Queued("q2", prompt(3, 4), "e0"),
        Queued("q3", prompt(5), "e0"),
    ]
    assert plan(queue, ["e0"]) == {"e0": {"q1": hexes(1, 2)}}  # q2 does not fit: nor does q3
    monkeypatch.setattr(announce, "MAX_EXPECTED", 2)
    queue = [Queued(f"q{n}", prompt(n), "e0") for n in range(4)]
    assert list(plan(queue, ["e0"])["e0"]) == ["q0", "q1"]


def test_a_set_is_sent_when_it_changed_and_resent_while_not_empty():
    sets = {"e0": {"q1": hexes(1)}, "e1": {}, "e2": {}}
    assert due(sets, {}, 0.0) == ["e0"]  # nothing to clear where nothing was sent
    sent = {"e0": Sent(sets["e0"], 0.0, 1), "e1": Sent({"q9": hexes(9)}, 0.0, 2), "e2": Sent({}, 0.0, 3)}
    assert due(sets, sent, 1.0) == ["e1"]  # e1's request left the queue: cleared
    assert due(sets, sent, RESEND_S) == ["e0", "e1"]  # e0's kept alive; e2's empty set is not resent


def test_a_set_the_sidecar_holds_is_changed_else_sent_whole():
    first = {"q1": hexes(1, 2), "q2": hexes(3)}
    assert message("a", None, first, 1) == {"from": "a", "seq": 1, "requests": first}
    then = {"q2": hexes(3), "q3": hexes(4, 5)}  # q1 left, q3 came
    assert message("a", Sent(first, 0.0, 1), then, 2) == {
        "from": "a",
        "seq": 2,
        "base": 1,
        "add": {"q3": hexes(4, 5)},
        "order": ["q2", "q3"],
    }
    # not acknowledged (refused, or no answer): the sidecar may not hold it
    assert message("a", Sent(first, 0.0, None), then, 2) == {"from": "a", "seq": 2, "requests": then}


def make_gate(endpoints: dict[str, str | None], inflight: int = 1) -> tuple[Gate, Fleet]:
    config = RouterConfig.model_validate(
        {"model": {"name": "m", "max_context_tokens": 1024}, "queue": {"max_inflight_per_endpoint": inflight}}
    )
    fleet = Fleet(inflight, 100)
    for name, expect in endpoints.items():
        fleet.add(name, Address("http://127.0.0.1:9", {}, expect))
    return Gate(config, fleet, random.Random(0)), fleet


async def wait_for_slot(gate: Gate, asked: Prompt) -> None:
    route = await gate.enter(asked, 0)
    gate.finished(route.endpoints[0])


@pytest.mark.parametrize("holder", ["e0", "e1"])
async def test_a_queued_request_is_expected_where_its_blocks_are(holder):
    gate, fleet = make_gate({"e0": None, "e1": None})
    asked = prompt(1, 2, 3)
    fleet.endpoints[holder].view.routed(asked.blocks, 0.0)  # it served this prefix before
    busy = [await gate.enter(prompt(50 + n), 0) for n in range(2)]  # both endpoints full
    waiting = asyncio.create_task(wait_for_slot(gate, asked))
    await asyncio.sleep(0)
    (queued,) = gate.queue()
    assert queued.endpoint == holder and queued.prompt is asked
    for route in busy:
        gate.finished(route.endpoints[0])
    await waiting
    assert gate.queue() == []


@pytest.fixture
def sidecar() -> Iterator[tuple[KVTierService, str]]:
    """A real sidecar's service (DRAM and NVMe tiers) and its HTTP server on loopback,
    announcements on."""
    with routing_lookahead.sidecar() as announcers:
        server = serve_http(0, TierMetrics(), lambda: True, "127.0.0.1", announce=announcers.handle)
        yield announcers.service, f"http://127.0.0.1:{server.server_address[1]}{EXPECT_PATH}"
        server.shutdown()


async def test_the_router_announces_its_queue_to_a_real_sidecar_and_clears_it(sidecar):
    service, url = sidecar
    assert service.dram is not None
    gate, fleet = make_gate({"e0": url})
    first = await gate.enter(prompt(9), 0)
    asked = prompt(1, 2)
    waiting = asyncio.create_task(wait_for_slot(gate, asked))
    await asyncio.sleep(0)
    async with aiohttp.ClientSession() as session:
        announcer = Announcer(session, fleet, gate, name="chat-router-a")
        await announcer.tick(0.0)
        assert [service.dram.index.is_expected(k) for k in asked.blocks] == [True, True]
        assert announcer.announced == 1
        gate.finished(first.endpoints[0])  # the waiter gets the slot: it leaves the queue
        await waiting
        await announcer.tick(1.0)
        assert [service.dram.index.is_expected(k) for k in asked.blocks] == [False, False]
        assert announcer.sent["e0"].requests == {} and announcer.sent["e0"].seq == 2  # a change


@pytest.fixture
def old_sidecar() -> Iterator[tuple[KVTierService, str]]:
    """A sidecar from before changes: a body without ``requests`` is a 400."""
    with routing_lookahead.sidecar() as announcers:

        def handle(body: Any) -> dict[str, Any]:
            if "requests" not in body:
                raise ValueError("requests: expected an object of request id -> block keys")
            return announcers.handle(body)

        server = serve_http(0, TierMetrics(), lambda: True, "127.0.0.1", announce=handle)
        yield announcers.service, f"http://127.0.0.1:{server.server_address[1]}{EXPECT_PATH}"
        server.shutdown()


@pytest.mark.parametrize("kind", ["restarted", "from before changes"])
async def test_a_sidecar_that_cannot_take_a_change_gets_the_whole_set(kind, sidecar, old_sidecar):
    service, url = sidecar if kind == "restarted" else old_sidecar
    assert service.dram is not None
    gate, fleet = make_gate({"e0": url})
    busy = await gate.enter(prompt(9), 0)
    waiting = [asyncio.create_task(wait_for_slot(gate, prompt(n, n + 1))) for n in (1, 3)]
    await asyncio.sleep(0)
    async with aiohttp.ClientSession() as session:
        announcer = Announcer(session, fleet, gate, name="chat-router-a")
        await announcer.tick(0.0)
        if kind == "restarted":  # as if: it holds no set 41 of ours
            announcer.sent["e0"] = dataclasses.replace(announcer.sent["e0"], seq=41, requests={})
        else:
            announcer.sent["e0"] = dataclasses.replace(announcer.sent["e0"], requests={})
        await announcer.tick(1.0)  # a change: refused (409, 400), then the whole set at once
        assert announcer.sent["e0"].seq == 3
        assert all(service.dram.index.is_expected(key(n)) for n in (1, 2, 3, 4))
        gate.finished(busy.endpoints[0])
        await asyncio.gather(*waiting)
