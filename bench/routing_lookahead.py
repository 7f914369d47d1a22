"""What the routers' look-ahead costs (``strata.router.announce`` and the sidecar's
``announced``): a full router queue, its sets sent to every replica's sidecar as whole sets and
as changes, side by side in one run.

The queue: ``QUEUE`` requests waiting at one router for ``ENDPOINTS`` replicas, each prompt
``blocks`` usable blocks long (32: a 512-token prompt in 16-token blocks; 512: 8k tokens, the
Mooncake conversation trace's order). Every tick (``ANNOUNCE_EVERY_S``) ``MOVED`` requests leave
for their replicas and as many arrive, so every replica's set changes at every tick, as under
load. Measured per tick, over ``TICKS`` ticks: the router's CPU (the plan with its keys
memoized as the Announcer holds them, what is due, the bodies encoded as JSON), the bytes sent,
and one replica's sidecar CPU to parse and apply its body (a real ``KVTierService``, DRAM and
NVMe tiers on a temporary directory). Pure CPU; no sockets.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from strata.router.announce import ANNOUNCE_EVERY_S, Requests, Sent, due, hex_keys, message, plan
from strata.router.choose import Prompt
from strata.router.gate import Queued
from strata.worker.config import KVTierConfig
from strata.worker.kvtier.announced import Announcers
from strata.worker.kvtier.service import KVTierService

QUEUE = 1024
ENDPOINTS = 8
BLOCK_TOKENS = 16
MOVED = 8  # requests dispatched, and arrived, per tick
TICKS = 20
BLOCKS = (32, 512)
MODES = ("whole", "change")


def queued(n: int, blocks: int) -> Queued:
    keys = [(n << 20 | b).to_bytes(16, "big") for b in range(blocks)]
    return Queued(f"r{n}", Prompt(keys, blocks * BLOCK_TOKENS + 1, BLOCK_TOKENS), f"e{n % ENDPOINTS}")


def queues(blocks: int) -> Iterator[list[Queued]]:
    """The queue at each tick: the oldest ``MOVED`` leave, as many new ones arrive."""
    queue = [queued(n, blocks) for n in range(QUEUE)]
    for tick in range(TICKS + 1):
        yield queue
        arrived = [queued(QUEUE + tick * MOVED + n, blocks) for n in range(MOVED)]
        queue = queue[MOVED:] + arrived


@contextmanager
def sidecar() -> Iterator[Announcers]:
    with tempfile.TemporaryDirectory(prefix="strata-lookahead-") as tmp:
        root = Path(tmp)
        config = KVTierConfig.model_validate(
            {
                "enabled": True,
                "socket_path": str(root / "kv.sock"),
                "dram": {"capacity_bytes": 64 * 4096, "shm_path": str(root / "shm" / "kv")},
                "nvme": {"capacity_bytes": 64 * 4096, "path": str(root / "nvme"), "admit_after_hits": 0},
            }
        )
        service = KVTierService(config, staging_slots=4)
        service.configure(4096)
        try:
            yield Announcers(service)
        finally:
            service.close()


def measure(blocks: int, mode: str) -> dict[str, float]:
    """One mode's figures per tick, after the first (whole) set every mode sends."""
    memo: dict[str, list[str]] = {}

    def keys_of(request: Queued) -> list[str]:
        if request.request not in memo:
            memo[request.request] = hex_keys(request)
        return memo[request.request]

    sent: dict[str, Sent] = {}
    router_s = sidecar_s = 0.0
    sent_bytes = 0
    with sidecar() as announcers:
        for tick, queue in enumerate(queues(blocks)):
            started = time.process_time()
            bodies = encoded(plan(queue, [f"e{k}" for k in range(ENDPOINTS)], keys_of), sent, tick, mode)
            spent = time.process_time() - started
            started = time.process_time()
            announcers.handle(json.loads(bodies["e0"]))
            if tick:  # the first set is whole in every mode
                router_s, sidecar_s = router_s + spent, sidecar_s + time.process_time() - started
                sent_bytes += sum(len(b) for b in bodies.values())
    return {
        "router_ms_per_tick": round(router_s / TICKS * 1e3, 2),
        "router_core_share": round(router_s / TICKS / ANNOUNCE_EVERY_S, 4),
        "bytes_per_tick": round(sent_bytes / TICKS),
        "sidecar_ms_per_message": round(sidecar_s / TICKS * 1e3, 2),
    }


def encoded(sets: dict[str, Requests], sent: dict[str, Sent], tick: int, mode: str) -> dict[str, bytes]:
    """The bodies due now, as the Announcer builds them; every one acknowledged."""
    bodies = {}
    for name in due(sets, sent, float(tick)):
        last = sent.get(name) if mode == "change" else None
        bodies[name] = json.dumps(message("router", last, sets[name], tick + 1)).encode()
        sent[name] = Sent(sets[name], float(tick), tick + 1)
    return bodies


def ratio(whole: float, change: float) -> float:
    return round(whole / max(change, 1e-3), 1)


def run(measure_one: Callable[[int, str], dict[str, float]] = measure) -> dict[str, Any]:
    result: dict[str, Any] = {"queue": QUEUE, "endpoints": ENDPOINTS, "moved_per_tick": MOVED}
    for blocks in BLOCKS:
        modes = {mode: measure_one(blocks, mode) for mode in MODES}
        whole, change = modes["whole"], modes["change"]
        modes["whole_over_change"] = {
            "router_cpu": ratio(whole["router_ms_per_tick"], change["router_ms_per_tick"]),
            "bytes": ratio(whole["bytes_per_tick"], change["bytes_per_tick"]),
            "sidecar_cpu": ratio(whole["sidecar_ms_per_message"], change["sidecar_ms_per_message"]),
        }
        result[f"{blocks}_blocks"] = modes
    return result


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
