"""The chaos benchmark's clients: streamed completions at temperature 0 over a fixed pool of
prompts, at a steady rate on a thread of their own (``SteadyLoad``) or all at once (``burst``),
each recorded as a ``chaos_outcome.Response``.

Every request opens its own connection (no keep-alive), as many independent clients would: a
connection pooled across a fault would charge the client's reuse of a dead socket to the fault.
Only loopback addresses are dialled; ``StreamState`` (pure) reads the server-sent events."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import random
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench.chaos_outcome import Response

MODEL = "tiny"
MAX_TOKENS = 8
REQUEST_TIMEOUT_S = 120.0
STOP_WITHIN_S = 300.0  # the requests in flight end within their own timeout; this bounds a hang
TOKEN_LOW, TOKEN_HIGH = 32, 126  # printable ASCII: any test model's vocabulary has these ids


def prompt_pool(
    prefixes: int = 4, per_prefix: int = 6, prefix_tokens: int = 96, seed: int = 7
) -> list[list[int]]:
    """Prompts that share prefixes in groups, so the caches have something to hit."""
    draw = random.Random(seed)

    def tokens(n: int) -> list[int]:
        return [draw.randint(TOKEN_LOW, TOKEN_HIGH) for _ in range(n)]

    heads = [tokens(prefix_tokens) for _ in range(prefixes)]
    return [head + tokens(16) for head in heads for _ in range(per_prefix)]


def body(prompt: Sequence[int]) -> dict[str, Any]:
    return {
        "model": MODEL,
        "prompt": list(prompt),
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }


@dataclass
class StreamState:
    """What a completion's event stream said so far."""

    tokens: int = 0
    text: str = ""
    finished: bool = False
    prompt_tokens: int = 0
    cached_tokens: int = 0

    def feed(self, line: str) -> None:
        if not line.startswith("data:"):
            return
        data = line[5:].strip()
        if data == "[DONE]":
            self.finished = True
            return
        chunk = json.loads(data)
        for choice in chunk.get("choices") or []:
            if choice.get("text"):
                self.tokens += 1
                self.text += choice["text"]
        usage = chunk.get("usage") or {}
        self.prompt_tokens = usage.get("prompt_tokens", self.prompt_tokens)
        details = usage.get("prompt_tokens_details") or {}
        self.cached_tokens = details.get("cached_tokens") or self.cached_tokens


async def send(
    client: httpx.AsyncClient, url: str, pool: Sequence[Sequence[int]], index: int, t0: float
) -> Response:
    """One completion; never raises (what went wrong is in the Response)."""
    sent, state = time.monotonic() - t0, StreamState()
    status: int | None = None
    retry_after, error = False, ""
    try:
        async with client.stream("POST", url, json=body(pool[index])) as reply:
            status, retry_after = reply.status_code, "retry-after" in reply.headers
            if status == 200:
                async for line in reply.aiter_lines():
                    state.feed(line)
            else:
                await reply.aread()
    except (httpx.HTTPError, json.JSONDecodeError, OSError) as exc:
        error = f"{type(exc).__name__}: {str(exc)[:120]}"
    fields = state.__dict__
    return Response(sent, time.monotonic() - t0, index, status, retry_after, error=error, **fields)


def new_client(concurrency: int) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=0)
    timeout = httpx.Timeout(REQUEST_TIMEOUT_S, connect=30.0)
    return httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False)


async def burst(url: str, pool: Sequence[Sequence[int]], count: int, t0: float) -> list[Response]:
    """``count`` requests at once (the prompts in turn)."""
    async with new_client(count) as client:
        sends = (send(client, url, pool, i % len(pool), t0) for i in range(count))
        return list(await asyncio.gather(*sends))


@dataclass
class SteadyLoad:
    """Requests at ``rate_per_s``, the prompts in turn, until stopped; on a thread of its own."""

    url: str
    pool: Sequence[Sequence[int]]
    rate_per_s: float
    t0: float = field(default_factory=time.monotonic)
    done: list[Response] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _thread: threading.Thread | None = None

    def start(self) -> SteadyLoad:
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._run()), name="chaos-load", daemon=True
        )
        self._thread.start()
        return self

    def take(self) -> list[Response]:
        """The responses finished since the last take (by completion)."""
        with self._lock:
            taken, self.done = self.done, []
        return taken

    def stop(self) -> list[Response]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(STOP_WITHIN_S)
            if self._thread.is_alive():
                raise TimeoutError(f"chaos load: requests in flight did not end within {STOP_WITHIN_S:.0f} s")
        return self.take()

    async def _run(self) -> None:
        tasks: set[asyncio.Task[None]] = set()
        began = time.monotonic()
        async with new_client(1024) as client:
            for n in itertools.count():
                if self._stop.is_set():
                    break
                task = asyncio.create_task(self._one(client, n % len(self.pool)))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                await asyncio.sleep(max(0.0, (n + 1) / self.rate_per_s - (time.monotonic() - began)))
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*tasks)

    async def _one(self, client: httpx.AsyncClient, index: int) -> None:
        response = await send(client, self.url, self.pool, index, self.t0)
        with self._lock:
            self.done.append(response)
