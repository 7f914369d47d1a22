"""Look-ahead from the routers: requests queued at a router, announced to the sidecar of the
replica they are expected to go to (``POST /kv/expect`` on the metrics port, ``protocol.EXPECT_PATH``).

Why: a router keeps at most ``max_inflight_per_endpoint`` requests at each replica, as many as
the engine batches, so under load the engine's own queue is short and the requests that will
come next wait at the router. Announced, their blocks are kept and moved up to DRAM before they
arrive, as the engine's queued requests' are (``KVTierService.expect``).

A router sends its whole set for this replica each time (``{"from": name, "requests": {id:
[hex key, ...]}}``), so a lost or repeated message does no harm; the sidecar applies the
difference. A router that stops sending (dead, or the request left its queue unannounced) has
its set forgotten after ``ANNOUNCED_TTL_S``. The routers' sets are bounded together: at most
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

from strata.worker.kvtier.budget import MAX_EXPECTED, MAX_EXPECTED_BLOCKS, nearest_within
from strata.worker.kvtier.service import KVTierService, Owner

MAX_ANNOUNCERS = 8  # routers of one service: 2 by default; more only while they roll
ANNOUNCED_TTL_S = 30.0  # routers resend their sets every few seconds
MAX_NAME = 253

Announced = dict[str, list[bytes]]  # request id -> its block keys, nearest request first


def parse(body: object) -> tuple[str, Announced]:
    """The router's name and its requests; ValueError naming the field that is wrong."""
    if not isinstance(body, Mapping):
        raise ValueError("body: expected a JSON object")
    name = body.get("from")
    if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME:
        raise ValueError(f"from: expected the router's name (1 to {MAX_NAME} characters)")
    requests = body.get("requests")
    if not isinstance(requests, Mapping):
        raise ValueError("requests: expected an object of request id -> block keys")
    return name, {str(rid): _keys(str(rid), keys) for rid, keys in requests.items()}


def _keys(request: str, keys: object) -> list[bytes]:
    if not isinstance(keys, list):
        raise ValueError(f"requests.{request}: expected a list of hex block keys")
    try:
        return [bytes.fromhex(k) for k in keys]
    except (TypeError, ValueError):
        raise ValueError(f"requests.{request}: expected a list of hex block keys") from None


def within(requests: Announced, room: int) -> Announced:
    """The nearest requests whose blocks fit in ``room``, ``MAX_EXPECTED`` at most (the rest are
    not announced)."""
    taken = nearest_within((len(keys) for keys in requests.values()), room, MAX_EXPECTED)
    return dict(itertools.islice(requests.items(), taken))


@dataclass
class _Router:
    owner: Owner = field(default_factory=lambda: Owner(source="routers"))
    seen: float = 0.0


class Announcers:
    """The routers' announced requests, applied to ``service`` as a connection's are."""

    def __init__(self, service: KVTierService, clock: Callable[[], float] = time.monotonic) -> None:
        self.service, self.clock = service, clock
        self.refused = 0  # requests past the routers' share of the look-ahead
        self._routers: dict[str, _Router] = {}
        self._lock = threading.Lock()

    def replace(self, name: str, requests: Announced) -> int:
        """This router's set is now ``requests``; returns how many of them are announced."""
        with self._lock:
            self._expire(self.clock())
            router = self._routers.pop(name, None) or _Router()
            self._routers[name] = router  # the most recent last
            router.seen = self.clock()
            others = sum(r.owner.expected_blocks for n, r in self._routers.items() if n != name)
            kept = within(requests, MAX_EXPECTED_BLOCKS - others)
            self.refused += len(requests) - len(kept)
            self.service.metrics.lookahead_refused.labels("routers").inc(len(requests) - len(kept))
            self._apply(router.owner, kept)
            while len(self._routers) > MAX_ANNOUNCERS:
                self._forget(next(iter(self._routers)))
            return len(kept)

    def expire(self) -> None:
        with self._lock:
            self._expire(self.clock())

    def requests(self) -> int:
        with self._lock:
            return sum(len(r.owner.expected) for r in self._routers.values())

    def handle(self, body: Any) -> dict[str, Any]:
        """``POST /kv/expect``: ValueError for a body that is wrong, RuntimeError before the
        engine's hello (nothing to keep blocks in yet)."""
        name, requests = parse(body)
        return {"announced": self.replace(name, requests)}

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
