"""Look-ahead from the router's queue: each replica's sidecar learns which requests wait here for
it (``POST /kv/expect``, ``strata.worker.kvtier.announced``), so it keeps their blocks and moves
them up to DRAM before they arrive.

Why: the router lets each replica run at most as many requests as its engine batches, so under
load the engine's own queue is short and the requests that come next wait here. Each waiting
request is expected at the endpoint its ranking put first when it queued (``Gate.queue``).

A replica's set is sent when it changed (at most every ``ANNOUNCE_EVERY_S``) and again every
``RESEND_S`` while not empty, so the sidecar, which forgets a silent router's set after 30 s,
keeps it exactly as long as the requests wait. The first message is the whole set; once the
sidecar has acknowledged a set, the next message is the change to it (``message``): the
requests new since, and the order of the whole set. A sidecar that does not hold that set any
more (restarted) answers 409, one from before changes 400, and either gets the whole set at
once; after any other failure the next message is the whole set. A failed send is retried
when the set changes or at the next resend; the look-ahead is a hint, and requests never wait
for it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

import aiohttp

from strata.common.kvbudget import MAX_EXPECTED, MAX_EXPECTED_BLOCKS, nearest_within
from strata.router.fleet import Fleet
from strata.router.gate import Gate, Queued

log = logging.getLogger(__name__)
ANNOUNCE_EVERY_S = 0.25
RESEND_S = 10.0  # well within the sidecar's ANNOUNCED_TTL_S
POST_TIMEOUT_S = 5.0
# Answers to a change after which the whole set goes at once: 409, the sidecar lost the set
# the change was to (it restarted); 400, a sidecar from before changes (a rolling upgrade).
WHOLE_AFTER = (HTTPStatus.CONFLICT, HTTPStatus.BAD_REQUEST)

Requests = dict[str, list[str]]  # request id -> hex block keys, nearest request first
Sets = dict[str, Requests]  # by endpoint


@dataclass(frozen=True)
class Sent:
    """The set last sent to an endpoint."""

    requests: Requests
    at: float
    seq: int | None  # the sidecar acknowledged it as this; None: it may not hold it


def hex_keys(queued: Queued) -> list[str]:
    """The request's blocks a cache may serve, as the sidecar takes them."""
    usable = queued.prompt.blocks[: queued.prompt.usable_blocks]
    return [k.hex() for k in usable if isinstance(k, bytes)]


def plan(
    queue: Iterable[Queued], endpoints: Iterable[str], keys_of: Callable[[Queued], list[str]] = hex_keys
) -> Sets:
    """Each endpoint's set (empty where nothing waits for it): the usable blocks of the requests
    expected there, nearest first, within what a sidecar takes from its routers (``MAX_EXPECTED``
    requests, ``MAX_EXPECTED_BLOCKS`` blocks: the farther ones would not be announced anyway, and
    a queue of long prompts would otherwise make a body of tens of MB)."""
    waiting: dict[str, list[Queued]] = {name: [] for name in endpoints}
    for queued in queue:
        if queued.endpoint in waiting:
            waiting[queued.endpoint].append(queued)
    return {name: _nearest(queued, keys_of) for name, queued in waiting.items()}


def _nearest(queued: list[Queued], keys_of: Callable[[Queued], list[str]]) -> Requests:
    """The nearest of one endpoint's requests that its sidecar takes (``nearest_within``), keys
    taken only as far as it looks."""
    keys: list[list[str]] = []

    def sizes() -> Iterator[int]:
        for request in queued:
            keys.append(keys_of(request))
            yield len(keys[-1])

    taken = nearest_within(sizes(), MAX_EXPECTED_BLOCKS, MAX_EXPECTED)
    return {request.request: k for request, k in zip(queued[:taken], keys, strict=False)}


def due(sets: Sets, sent: Mapping[str, Sent], now: float) -> list[str]:
    """The endpoints to send to now: their set changed since it was last sent (an empty set to
    an endpoint never sent anything has not), or it is not empty and was sent ``RESEND_S`` ago."""

    def is_due(name: str, requests: Requests) -> bool:
        last = sent.get(name)
        if last is None:
            return bool(requests)
        return last.requests != requests or (bool(requests) and now - last.at >= RESEND_S)

    return [name for name, requests in sets.items() if is_due(name, requests)]


def message(name: str, last: Sent | None, requests: Requests, seq: int) -> dict[str, Any]:
    """The body that makes ``requests`` the sidecar's set ``seq``: the change from ``last``
    where the sidecar acknowledged it, else the whole set."""
    if last is None or last.seq is None:
        return {"from": name, "seq": seq, "requests": requests}
    before = last.requests
    added = {rid: keys for rid, keys in requests.items() if rid not in before or before[rid] != keys}
    return {"from": name, "seq": seq, "base": last.seq, "add": added, "order": list(requests)}


def router_name() -> str:
    """What the sidecars know this router by: its pod's name."""
    return os.environ.get("HOSTNAME") or socket.gethostname()


@dataclass
class Announcer:
    session: aiohttp.ClientSession
    fleet: Fleet
    gate: Gate
    name: str = field(default_factory=router_name)
    sent: dict[str, Sent] = field(default_factory=dict)
    # Each waiting request's keys, converted once: a tick sees the whole queue every 0.25 s.
    _keys: dict[str, list[str]] = field(default_factory=dict)
    _seq: int = 0  # the last set's number, over all endpoints

    @property
    def announced(self) -> int:
        """Requests in the sets last sent (``strata_router_lookahead_requests``)."""
        return sum(len(last.requests) for last in self.sent.values())

    async def run(self) -> None:
        while True:
            try:
                await self.tick(time.monotonic())
            except Exception:  # a hint: never let it stop the look-ahead for good
                log.exception("look-ahead: tick failed")
            await asyncio.sleep(ANNOUNCE_EVERY_S)

    async def tick(self, now: float) -> None:
        targets = {n: e.address.expect for n, e in self.fleet.endpoints.items() if e.address.expect}
        for gone in set(self.sent) - set(targets):
            del self.sent[gone]
        queue = self.gate.queue()
        waiting = {q.request for q in queue}
        self._keys = {r: keys for r, keys in self._keys.items() if r in waiting}
        sets = plan(queue, targets, self._keys_of)
        await asyncio.gather(*(self._send(n, targets[n], sets[n], now) for n in due(sets, self.sent, now)))

    def _keys_of(self, queued: Queued) -> list[str]:
        keys = self._keys.get(queued.request)
        if keys is None:
            keys = self._keys[queued.request] = hex_keys(queued)
        return keys

    async def _send(self, endpoint: str, url: str, requests: Requests, now: float) -> None:
        """Recorded whatever the answer: a failed set is sent again (whole) when it changes or
        at the next resend, not at every tick (a sidecar before its engine's hello answers 503)."""
        self._seq += 1
        body = message(self.name, self.sent.get(endpoint), requests, self._seq)
        status = await self._post(endpoint, url, body)
        if "base" in body and status in WHOLE_AFTER:
            self._seq += 1
            status = await self._post(endpoint, url, message(self.name, None, requests, self._seq))
        self.sent[endpoint] = Sent(requests, now, self._seq if status == HTTPStatus.OK else None)

    async def _post(self, endpoint: str, url: str, body: dict[str, Any]) -> int | None:
        """The answer's status; None where none came."""
        timeout = aiohttp.ClientTimeout(total=POST_TIMEOUT_S)
        try:
            async with self.session.post(url, json=body, timeout=timeout) as resp:
                if resp.status != HTTPStatus.OK:
                    why = await resp.text()
                    log.debug("look-ahead to %s refused: HTTP %d %s", endpoint, resp.status, why)
                return resp.status
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            log.debug("look-ahead to %s not sent: %s", endpoint, exc or type(exc).__name__)
            return None
