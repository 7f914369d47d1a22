"""The drain after SIGTERM, in process: readiness fails at once, new requests get a clear 503,
requests already accepted (streams and queued ones) finish, and the drain can be cut off."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from strata.common.openai.errors import DRAINING_HEADER
from strata.worker.server.app import build_app
from strata.worker.server.drain import Drain
from strata.worker.server.engine_loop import EngineLoop
from strata.worker.server.generate import DRAINING_MESSAGE
from tests.worker.conftest import EngineFactory

Client = TestClient[web.Request, web.Application]


@asynccontextmanager
async def serve(make_engine: EngineFactory, **engine: Any) -> AsyncIterator[tuple[Client, Drain, EngineLoop]]:
    drain, loop = Drain(), EngineLoop(make_engine(**engine))
    client = TestClient(TestServer(build_app(loop, drain)))
    await client.start_server()
    try:
        yield client, drain, loop
    finally:
        await client.close()


def completion(max_tokens: int, stream: bool) -> dict[str, Any]:
    return {
        "model": "tiny",
        "prompt": "drain me",
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": stream,
    }


async def until(predicate: Any, what: str) -> None:
    for _ in range(600):
        if predicate():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def finish_reasons(resp: Any) -> list[str | None]:
    body = (await resp.read()).decode()
    events = [line.removeprefix("data: ") for line in body.split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e)["choices"][0]["finish_reason"] for e in events[:-1]]


def test_drain_counts_requests_and_stays_idle_without_any() -> None:
    async def run() -> None:
        drain = Drain()
        assert await drain.wait_idle(0.01) and not drain.draining
        with drain.track() as early:
            drain.mark_stream(early)
            drain.begin()
            assert (drain.in_flight, drain.in_flight_streams) == (1, 1)
            assert not await drain.wait_idle(0.01)
            early.status = 200
        with drain.track() as failed:
            failed.status = 503
        assert await drain.wait_idle(0.01)
        summary = drain.summary(aborted=0)
        assert (summary.in_flight_at_start, summary.finished, summary.streams, summary.errors) == (1, 2, 1, 1)

    asyncio.run(run())


async def test_draining_fails_readiness_refuses_new_work_and_finishes_streams(
    make_engine: EngineFactory,
) -> None:
    async with serve(make_engine, max_num_seqs=1) as (client, drain, loop):
        streaming = await client.post("/v1/completions", json=completion(600, stream=True))
        assert streaming.status == 200
        await streaming.content.readline()  # its first token is out: it is mid-stream
        queued = asyncio.ensure_future(client.post("/v1/completions", json=completion(20, stream=False)))
        await until(lambda: loop.num_waiting == 1, "the second request to queue")
        drain.begin()
        ready = await client.get("/ready")
        assert ready.status == 503 and (await ready.json())["status"] == "draining"
        refused = await client.post("/v1/completions", json=completion(5, stream=False))
        assert refused.status == 503 and refused.headers["Retry-After"] == "1"
        assert refused.headers["Connection"] == "close" and refused.headers[DRAINING_HEADER] == "true"
        error = (await refused.json())["error"]
        assert error["message"] == DRAINING_MESSAGE and error["type"] == "service_unavailable"
        assert (await finish_reasons(streaming))[-1] == "length"
        answered = await queued
        assert answered.status == 200 and (await answered.json())["usage"]["completion_tokens"] == 20
        assert await drain.wait_idle(30)
        summary = drain.summary(aborted=0)
        assert (summary.in_flight_at_start, summary.finished, summary.streams, summary.errors) == (2, 2, 1, 0)
        metrics = await (await client.get("/metrics")).text()
        assert 'strata_worker_rejected_requests_total{reason="shutdown"} 1.0' in metrics


async def test_a_cut_off_drain_ends_streams_and_refuses_the_queue(make_engine: EngineFactory) -> None:
    async with serve(make_engine, max_num_seqs=1) as (client, drain, loop):
        streaming = await client.post("/v1/completions", json=completion(900, stream=True))
        await streaming.content.readline()
        queued = asyncio.ensure_future(client.post("/v1/completions", json=completion(20, stream=False)))
        await until(lambda: loop.num_waiting == 1, "the second request to queue")
        drain.begin()
        loop.abort_all("shutdown")
        assert (await finish_reasons(streaming))[-1] == "error"  # cut, and says so
        cut = await queued
        assert cut.status == 503 and (await cut.json())["error"]["message"] == DRAINING_MESSAGE
        assert await drain.wait_idle(30)
        assert loop.engine.stats.generation_tokens < 900
        assert not loop.engine.has_unfinished()
