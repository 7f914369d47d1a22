"""Pod IPs for the autoscaler's unit tests. It scrapes every pod at its pod IP, port 8000, as on a
real cluster, so a test serves a worker's /metrics on a loopback address of its own: outside every
test cluster's pod ranges (127.64.0.0/10), and random, so concurrent test runs do not collide."""

from __future__ import annotations

import random

from aiohttp import web

from strata.common.endpoints import WORKER_PORT

NOBODY = "127.208.0.1"  # a pod IP where nothing listens: the scrape is refused at once


async def serve_as_pod(runner: web.AppRunner, port: int = WORKER_PORT, attempts: int = 20) -> str:
    """Start ``runner`` on ``port`` of a free address of 127.200.0.0/13; that address."""
    for _ in range(attempts):
        ip = f"127.{random.randint(200, 207)}.{random.randint(0, 255)}.{random.randint(1, 254)}"
        try:
            await web.TCPSite(runner, ip, port).start()
        except OSError:  # taken by a concurrent test: pick another
            continue
        return ip
    raise RuntimeError(f"no free loopback address for a pod's metrics after {attempts} tries")
