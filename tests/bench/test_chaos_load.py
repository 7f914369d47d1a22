"""The chaos benchmark's clients, without a cluster: the event stream read as a client reads it,
the prompt pool, and one request against a local server that breaks in each way a fault does."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

from aiohttp import web

from bench import chaos_load
from bench.chaos_load import StreamState, prompt_pool
from bench.chaos_outcome import Kind, classify


def event(text: str = "", usage: dict[str, object] | None = None) -> str:
    chunk: dict[str, object] = {"choices": [{"text": text}] if text else [], "usage": usage}
    return "data: " + json.dumps(chunk)


def test_the_stream_state_counts_tokens_text_usage_and_the_end() -> None:
    state = StreamState()
    for line in [
        event("a"),
        "",
        event("b"),
        event(usage={"prompt_tokens": 112, "prompt_tokens_details": {"cached_tokens": 96}}),
        "data: [DONE]",
    ]:
        state.feed(line)
    assert (state.tokens, state.text, state.finished) == (2, "ab", True)
    assert (state.prompt_tokens, state.cached_tokens) == (112, 96)


def test_the_prompt_pool_shares_prefixes_in_groups_and_is_the_same_every_run() -> None:
    pool = prompt_pool(prefixes=2, per_prefix=3, prefix_tokens=32)
    assert len(pool) == 6 and pool == prompt_pool(prefixes=2, per_prefix=3, prefix_tokens=32)
    assert pool[0][:32] == pool[2][:32] != pool[3][:32]
    assert all(32 <= t <= 126 for p in pool for t in p)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def _serve_and_send(handler: Handler) -> Kind:
    app = web.Application()
    app.router.add_post("/v1/completions", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with chaos_load.new_client(2) as client:
            url = f"http://127.0.0.1:{port}/v1/completions"
            response = await chaos_load.send(client, url, prompt_pool(), 0, 0.0)
    finally:
        await runner.cleanup()
    return classify(response)


async def _streams(request: web.Request) -> web.StreamResponse:
    reply = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await reply.prepare(request)
    await reply.write((event("x") + "\n\ndata: [DONE]\n\n").encode())
    return reply


async def _breaks_mid_stream(request: web.Request) -> web.StreamResponse:
    reply = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await reply.prepare(request)
    await reply.write((event("x") + "\n\n").encode())
    assert request.transport is not None
    request.transport.abort()  # the process died with the stream under way
    return reply


async def _refuses(request: web.Request) -> web.Response:
    return web.json_response({"error": "busy"}, status=429, headers={"Retry-After": "1"})


async def _fails(request: web.Request) -> web.Response:
    return web.json_response({"error": "boom"}, status=502)


def test_one_request_is_classified_from_what_the_server_did() -> None:
    assert asyncio.run(_serve_and_send(_streams)) is Kind.ANSWERED
    assert asyncio.run(_serve_and_send(_breaks_mid_stream)) is Kind.CUT
    assert asyncio.run(_serve_and_send(_refuses)) is Kind.REFUSED
    assert asyncio.run(_serve_and_send(_fails)) is Kind.LOST
