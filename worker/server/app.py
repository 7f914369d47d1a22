"""The OpenAI-compatible HTTP API (aiohttp): completions, chat completions, models, health,
readiness and metrics. Every failure is an OpenAI-shaped JSON error and the server keeps serving.

Middlewares: a request id on every request (its log lines carry it, the response echoes it),
an optional API key on ``/v1/`` (probes and Prometheus need none), and JSON errors for anything
that escapes a handler.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web
from aiohttp.typedefs import Middleware

from strata.common.openai.auth import api_key_check
from strata.common.openai.errors import json_errors
from strata.common.openai.model_list import model_list
from strata.common.openai.request_id import echo_request_id, request_ids
from strata.worker.block_events import BlockEvents
from strata.worker.server import block_stream
from strata.worker.server.drain import Drain
from strata.worker.server.engine_loop import EngineLoop
from strata.worker.server.generate import (
    DRAIN_KEY,
    LOOP_KEY,
    METRICS_KEY,
    generate,
)
from strata.worker.server.metrics import WorkerMetrics

log = logging.getLogger(__name__)


async def completions(request: web.Request) -> web.StreamResponse:
    return await generate(request, "completion")


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await generate(request, "chat")


async def models(request: web.Request) -> web.Response:
    engine = request.app[LOOP_KEY].engine
    return web.json_response(model_list(engine.config.model.name, engine.max_context))


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def ready(request: web.Request) -> web.Response:
    loop = request.app[LOOP_KEY]
    if request.app[DRAIN_KEY].draining:
        return web.json_response({"status": "draining"}, status=503)
    if loop.alive:
        return web.json_response({"status": "ready", "model": loop.engine.config.model.name})
    return web.json_response({"status": "engine loop not running"}, status=503)


async def metrics_endpoint(request: web.Request) -> web.Response:
    body = request.app[METRICS_KEY].render()
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


def build_app(loop: EngineLoop, drain: Drain | None = None, api_key: str | None = None) -> web.Application:
    """The app; starting it starts the engine loop thread, cleaning it up stops the thread.
    ``drain`` is the shutdown state that main.py's signal handling begins; ``api_key``, when
    given, is required as a bearer token on ``/v1/``."""
    middlewares: list[Middleware] = [request_ids, json_errors]
    if api_key:
        middlewares.append(api_key_check(api_key))
    app = web.Application(middlewares=middlewares, client_max_size=64 * 2**20)
    app.on_response_prepare.append(echo_request_id)
    app[LOOP_KEY] = loop
    app[DRAIN_KEY] = drain or Drain()
    app[METRICS_KEY] = WorkerMetrics(
        loop, loop.engine.config.model.name, loop.engine.config.server.ttft_slo_s
    )
    events = BlockEvents(status=loop.load_status)
    loop.engine.blocks.attach(events)
    block_stream.install(app, events)

    async def start(app: web.Application) -> None:
        loop.start(asyncio.get_running_loop())

    async def stop(app: web.Application) -> None:
        await asyncio.get_running_loop().run_in_executor(None, loop.stop)

    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/ready", ready)
    app.router.add_get("/metrics", metrics_endpoint)
    return app
