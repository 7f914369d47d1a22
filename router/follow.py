"""Following an endpoint's block-event streams (``strata.worker.block_events``).

One task per endpoint and source (worker, sidecar): connect, take the snapshot, apply changes,
reconnect with backoff when the stream ends, fails or sends garbage. While a stream is down the
endpoint's view falls back to the router's own record. A worker stream that was synced and then
goes silent past ``events_silence_s`` (pings come every second) means a hung worker: the endpoint
is marked down, and requests still waiting on it for their first byte go elsewhere.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

from strata.router.fleet import Endpoint
from strata.worker.block_events import BadEvent, Event, parse_line

log = logging.getLogger(__name__)
BACKOFF_S = (0.5, 10.0)
READ_BUFFER = 1 << 20


@dataclass(frozen=True)
class Following:
    silence_s: float  # a stream silent this long is down (pings come every second)
    step_tokens: int  # the workers' max_batched_tokens
    on_hang: Callable[[Endpoint, str], None]  # a synced worker stream fell silent


async def follow(session: aiohttp.ClientSession, endpoint: Endpoint, source: str, how: Following) -> None:
    """Follow one stream until cancelled."""
    url = endpoint.address.events[source]
    backoff = BACKOFF_S[0]
    while True:
        try:
            await _read(session, url, endpoint, source, how)
            log.info("block events of %s (%s) ended", endpoint.name, source)
        except (aiohttp.ClientError, BadEvent, TimeoutError, OSError, ValueError) as exc:
            if isinstance(exc, TimeoutError) and endpoint.view.synced[source] and source == "worker":
                how.on_hang(endpoint, f"block events silent for {how.silence_s:g}s")
            log.info("block events of %s (%s) down: %s", endpoint.name, source, exc or type(exc).__name__)
        if endpoint.view.synced[source]:
            backoff = BACKOFF_S[0]
        endpoint.view.reset(source)
        await asyncio.sleep(backoff)
        backoff = min(backoff * 2, BACKOFF_S[1])


async def _read(
    session: aiohttp.ClientSession,
    url: str,
    endpoint: Endpoint,
    source: str,
    how: Following,
) -> None:
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=how.silence_s, sock_read=how.silence_s)
    async with session.get(url, timeout=timeout, read_bufsize=READ_BUFFER) as resp:
        if resp.status != 200:
            raise BadEvent(f"GET {url}: HTTP {resp.status}")
        async for line in resp.content:
            if line.strip():
                apply(endpoint, source, parse_line(line), how.step_tokens)


def apply(endpoint: Endpoint, source: str, event: Event, step_tokens: int) -> None:
    if event.kind == "ping":
        if source == "worker":
            reported = float(event.status.get("pending_tokens", 0) or 0)
            endpoint.pending_tokens = queued_beyond_a_step(reported, step_tokens)
            endpoint.kv_usage = float(event.status.get("kv_usage", 0) or 0)
        return
    endpoint.view.apply(source, event)


def queued_beyond_a_step(pending_tokens: float, step_tokens: int) -> float:
    """Prompt tokens that will delay a new request's prefill: the engine prefills in chunks of up
    to ``step_tokens`` per step, so what fits in one step runs alongside it, not before it."""
    return max(0.0, pending_tokens - step_tokens)
