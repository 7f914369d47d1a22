"""Look-ahead from the routers: requests queued at a router, announced to the sidecar of the
replica they are expected to go to (``POST /kv/expect`` on the metrics port, ``protocol.EXPECT_PATH``).

Why: a router keeps at most ``max_inflight_per_endpoint`` requests at each replica, as many as
the engine batches, so under load the engine's own queue is short and the requests that will
come next wait at the router. Announced, their blocks are kept and moved up to DRAM before they
arrive, as the engine's queued requests' are (``KVTierService.expect``).

A router sends its whole set for this replica (``{"from": name, "seq": n, "requests": {id:
[hex key, ...]}}``), then changes to it: ``{"from", "seq": n + 1, "base": n, "add": {id: [hex
key, ...]}, "order": [id, ...]}``, the requests new since set ``base`` and every request id of
the new set, nearest first (the rest left). Why: a queue of long prompts is megabytes of keys
and moves at every dispatch, while a change is a few requests; the whole set took 113 ms of the
router's CPU to encode for 8 replicas (512 blocks a request, 1,024 waiting). A change to a set
the sidecar does not hold (it restarted, or forgot the router) is refused with 409
(``protocol.ExpectConflict``), and the router sends its whole set; a repeated message does no
harm. A router that stops sending (dead, or the request left its queue unannounced) has its
set forgotten after ``ANNOUNCED_TTL_S``. The routers' sets are bounded together: at most
``MAX_ANNOUNCERS`` routers, ``MAX_EXPECTED_BLOCKS`` blocks (the budget counts them beside the
engine's), the nearest requests first.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from strata.common.kvbudget import MAX_EXPECTED, MAX_EXPECTED_BLOCKS, nearest_within
from strata.worker.kvtier.protocol import ExpectConflict
from strata.worker.kvtier.service import KVTierService, Owner

MAX_ANNOUNCERS = 8  # routers of one service: 2 by default; more only while they roll
ANNOUNCED_TTL_S = 30.0  # routers resend their sets every few seconds
MAX_NAME = 253

Announced = dict[str, list[bytes]]  # request id -> its block keys, nearest request first


@dataclass(frozen=True)
class Update:
    """One router's message: its whole set (``order`` None), or a change to its set ``base``."""

    name: str
    seq: int | None  # what later changes name as their base; None: none may
    add: Announced  # the whole set, or the requests new since ``base``
    base: int | None = None
    order: list[str] | None = None  # a change: every request id of the new set, nearest first


def parse(body: object) -> Update:
    """The router's message; ValueError naming the field that is wrong."""
    if not isinstance(body, Mapping):
        raise ValueError("body: expected a JSON object")
    name = body.get("from")
    if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME:
        raise ValueError(f"from: expected the router's name (1 to {MAX_NAME} characters)")
    seq = _number(body, "seq") if "seq" in body else None
    if "base" not in body:
        return Update(name, seq, _requests(body, "requests"))
    if seq is None:
        raise ValueError("seq: expected a number (a change names its own set)")
    order = body.get("order")
    if not isinstance(order, list) or not all(isinstance(rid, str) for rid in order):
        raise ValueError("order: expected a list of request ids, nearest first")
    return Update(name, seq, _requests(body, "add"), _number(body, "base"), order)


def _number(body: Mapping[str, Any], name: str) -> int:
    value = body.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{name}: expected a whole number, 0 or more")
    return value


def _requests(body: Mapping[str, Any], name: str) -> Announced:
    requests = body.get(name)
    if not isinstance(requests, Mapping):
        raise ValueError(f"{name}: expected an object of request id -> block keys")
    return {str(rid): _keys(f"{name}.{rid}", keys) for rid, keys in requests.items()}


def _keys(field: str, keys: object) -> list[bytes]:
    if not isinstance(keys, list):
        raise ValueError(f"{field}: expected a list of hex block keys")
    try:
        return [bytes.fromhex(k) for k in keys]
    except (TypeError, ValueError):
        raise ValueError(f"{field}: expected a list of hex block keys") from None


def within(requests: Announced, room: int) -> Announced:
    """The nearest requests whose blocks fit in ``room``, ``MAX_EXPECTED`` at most (the rest are
    not announced)."""
    taken = nearest_within((len(keys) for keys in requests.values()), room, MAX_EXPECTED)
    return dict(itertools.islice(requests.items(), taken))


@dataclass
class _Router:
    owner: Owner = field(default_factory=lambda: Owner(source="routers"))
    seen: float = 0.0
    requests: Announced = field(default_factory=dict)  # its last set, announced or not
    refused: set[str] = field(default_factory=set)  # of it, the requests not announced
    seq: int | None = None


class Announcers:
    """The routers' announced requests, applied to ``service`` as a connection's are."""

    def __init__(self, service: KVTierService, clock: Callable[[], float] = time.monotonic) -> None:
        self.service, self.clock = service, clock
        self.refused = 0  # requests past the routers' share of the look-ahead, each counted once
        self._routers: dict[str, _Router] = {}
        self._lock = threading.Lock()

    def replace(self, name: str, requests: Announced) -> int:
        """This router's set is now ``requests``; returns how many of them are announced."""
        return self.update(Update(name, None, requests))

    def update(self, update: Update) -> int:
        """Apply a router's message; ExpectConflict for a change to a set not held here."""
        with self._lock:
            self._expire(self.clock())
            requests = update.add if update.order is None else self._changed(update)
            router = self._routers.pop(update.name, None) or _Router()
            self._routers[update.name] = router  # the most recent last
            # What later changes may name: as much as one router's look-ahead could hold (a
            # router's plan sends no more), however large the body.
            router.seen, router.requests, router.seq = (
                self.clock(),
                within(requests, MAX_EXPECTED_BLOCKS),
                update.seq,
            )
            others = sum(r.owner.expected_blocks for n, r in self._routers.items() if n != update.name)
            kept = within(requests, MAX_EXPECTED_BLOCKS - others)
            # Counted once per request, as the engine's are, not again in every message.
            refused = requests.keys() - kept.keys()
            newly = len(refused - router.refused)
            router.refused = refused
            self.refused += newly
            self.service.metrics.lookahead_refused.labels("routers").inc(newly)
            self._apply(router.owner, kept)
            while len(self._routers) > MAX_ANNOUNCERS:
                self._forget(next(iter(self._routers)))
            return len(kept)

    def _changed(self, update: Update) -> Announced:
        """The set ``update`` changes its base into."""
        router = self._routers.get(update.name)
        if router is None or router.seq is None or router.seq != update.base:
            held = "none" if router is None or router.seq is None else router.seq
            raise ExpectConflict(f"base: set {update.base} of {update.name} is not held here ({held} is)")
        missing = [rid for rid in update.order or () if rid not in update.add and rid not in router.requests]
        if missing:
            raise ExpectConflict(f"order: {missing[0]} is neither in add nor in set {update.base}")
        return {
            rid: update.add[rid] if rid in update.add else router.requests[rid] for rid in update.order or ()
        }

    def expire(self) -> None:
        with self._lock:
            self._expire(self.clock())

    def handle(self, body: Any) -> dict[str, Any]:
        """``POST /kv/expect``: ValueError for a body that is wrong, ExpectConflict for a change
        to a set not held here, RuntimeError before the engine's hello (nothing to keep blocks in
        yet)."""
        return {"announced": self.update(parse(body))}

    def _apply(self, owner: Owner, requests: Announced) -> None:
        gone = [r for r in owner.expected if r not in requests]
        if gone:
            self.service.unexpect(owner, gone)
        for request, keys in requests.items():
            if owner.expected.get(request) != keys:
                self.service.expect(owner, request, keys)

    def _expire(self, now: float) -> None:
        for name in [n for n, r in self._routers.items() if now - r.seen > ANNOUNCED_TTL_S]:
            self._forget(name)

    def _forget(self, name: str) -> None:
        router = self._routers.pop(name)
        self.service.unexpect(router.owner, list(router.owner.expected))
