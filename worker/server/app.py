"""The OpenAI-compatible HTTP API (aiohttp): completions, chat completions, models, health,
readiness and metrics. Handlers validate, hand the request to the engine loop and relay its
token events; every failure is an OpenAI-shaped JSON error and the server keeps serving."""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from strata.worker.engine.llm_engine import RequestError
from strata.worker.engine.scheduler import QueueFull
from strata.worker.engine.sequence import SamplingParams
from strata.worker.logs import REQUEST_ID
from strata.worker.server.detok import Detokenizer
from strata.worker.server.drain import Drain, Outcome
from strata.worker.server.engine_loop import EngineLoop, RequestHandle, TokenEvent
from strata.worker.server.metrics import WorkerMetrics
from strata.worker.server.protocol import (
    ApiError,
    ApiRequest,
    Kind,
    parse_request,
    response_body,
    stream_chunk,
    usage,
    usage_chunk,
)
from strata.worker.server.request_id import HEADER as REQUEST_ID_HEADER
from strata.worker.server.request_id import request_id

log = logging.getLogger(__name__)
LOOP_KEY = web.AppKey("engine_loop", EngineLoop)
METRICS_KEY = web.AppKey("metrics", WorkerMetrics)
REQUEST_ID_KEY = web.RequestKey("request_id", str)
DRAIN_KEY = web.AppKey("drain", Drain)
REFUSED = {"queue_timeout": 429, "queue_full": 429, "error": 500, "shutdown": 503}
DRAINING_MESSAGE = "server shutting down: this replica is draining and takes no new requests; retry another"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error_response(err: ApiError, retry_after_s: int | None = None) -> web.Response:
    headers = {"Retry-After": str(retry_after_s)} if retry_after_s is not None else None
    return web.json_response(err.body(), status=err.status, headers=headers)


def retry_after_s(queue_timeout_s: float) -> int:
    """A hint, not a promise: a fraction of how long the queue may take to move."""
    return max(1, math.ceil(queue_timeout_s / 10))


@web.middleware
async def request_ids(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every request gets an id (the caller's X-Request-Id or a new one) for its log lines."""
    rid = request_id(request.headers)
    request[REQUEST_ID_KEY] = rid
    token = REQUEST_ID.set(rid)
    try:
        return await handler(request)
    finally:
        REQUEST_ID.reset(token)


async def echo_request_id(request: web.Request, response: web.StreamResponse) -> None:
    """Before headers go out (a stream prepares its response inside the handler)."""
    rid = request.get(REQUEST_ID_KEY)
    if rid is not None:
        response.headers[REQUEST_ID_HEADER] = rid


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error_response(ApiError(exc.status, f"{request.method} {request.path}: {exc.reason}"))
    except Exception:
        log.exception("unhandled error in %s %s", request.method, request.path)
        return error_response(ApiError(500, "internal error", kind="server_error"))


def _prepare(loop: EngineLoop, req: ApiRequest) -> tuple[list[int], SamplingParams]:
    engine = loop.engine
    if isinstance(req.prompt, str):
        token_ids = engine.tokenizer.encode(req.prompt, add_special_tokens=not req.templated)
    else:
        token_ids = req.prompt
    room = max(1, engine.max_context - len(token_ids))
    max_tokens = req.max_tokens or (min(16, room) if req.kind == "completion" else room)
    params = SamplingParams(
        max_tokens=max_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        seed=req.seed,
        ignore_eos=req.ignore_eos,
    )
    try:
        engine.validate(token_ids, params)
    except RequestError as exc:
        raise ApiError(400, str(exc), exc.field) from exc
    return token_ids, params


def draining_response() -> web.Response:
    """503 for work that arrives (or was cut off) while the replica shuts down; Connection:
    close so a keep-alive client's retry opens a new connection, to another replica."""
    response = error_response(ApiError(503, DRAINING_MESSAGE, kind="service_unavailable"), 1)
    response.force_close()
    return response


def _refusal(loop: EngineLoop, metrics: WorkerMetrics, reason: str) -> web.Response:
    metrics.rejected.labels(reason).inc()
    if reason == "error":
        return error_response(ApiError(500, "the engine failed on this request", kind="server_error"))
    if reason == "shutdown":
        return draining_response()
    message = "server busy: request queue is full" if reason == "queue_full" else "server busy: queue timeout"
    retry = retry_after_s(loop.engine.config.engine.queue_timeout_s)
    return error_response(ApiError(429, message, kind="rate_limit_error"), retry)


async def _generate(request: web.Request, kind: Kind) -> web.StreamResponse:
    drain = request.app[DRAIN_KEY]
    if drain.draining:
        request.app[METRICS_KEY].rejected.labels("shutdown").inc()
        return draining_response()
    with drain.track() as outcome:
        response = await _generate_tracked(request, kind, outcome)
        outcome.status = response.status
        return response


async def _generate_tracked(request: web.Request, kind: Kind, outcome: Outcome) -> web.StreamResponse:
    loop, metrics = request.app[LOOP_KEY], request.app[METRICS_KEY]
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return error_response(ApiError(400, f"request body is not valid JSON: {exc}"))
    try:
        name, template = loop.engine.config.model.name, loop.engine.chat_template
        req = parse_request(body, kind, name, template, request[REQUEST_ID_KEY])
        if req.stream:
            request.app[DRAIN_KEY].mark_stream(outcome)
        token_ids, params = _prepare(loop, req)
        handle = loop.submit(token_ids, params, req.priority)
    except ApiError as err:
        return error_response(err)
    except QueueFull:
        return _refusal(loop, metrics, "queue_full")
    finished = False
    try:
        first = await handle.events.get()
        if first.finish_reason in REFUSED:
            finished = True
            return _refusal(loop, metrics, first.finish_reason or "error")
        metrics.ttft.observe(time.monotonic() - handle.submitted_s)
        relay = _Relay(loop, metrics, req, handle, len(token_ids))
        response = await (relay.stream(request, first) if req.stream else relay.collect(first))
        finished = True
        return response
    finally:
        if not finished:
            loop.abort(handle)


class _Relay:
    """Turns one request's token events into a JSON response or an SSE stream."""

    def __init__(
        self, loop: EngineLoop, metrics: WorkerMetrics, req: ApiRequest, handle: RequestHandle, n: int
    ):
        self.loop, self.metrics, self.req, self.handle = loop, metrics, req, handle
        self.detok = Detokenizer(loop.engine.tokenizer, req.stop)
        self.prompt_tokens = n
        self.completion_tokens = 0
        self.last_s = time.monotonic()
        self.finish_reason: str | None = None

    def usage(self) -> dict[str, Any]:
        seq = self.handle.seq
        cached = sum(seq.hit_tokens.values()) if seq is not None else 0
        return usage(self.prompt_tokens, self.completion_tokens, cached)

    def _log_done(self) -> None:
        use = self.usage()
        log.info(
            "request finished",
            extra={
                "finish_reason": self.finish_reason,
                "prompt_tokens": use["prompt_tokens"],
                "completion_tokens": use["completion_tokens"],
                "cached_tokens": use["prompt_tokens_details"]["cached_tokens"],
                "e2e_s": round(time.monotonic() - self.handle.submitted_s, 4),
            },
        )

    def _take(self, event: TokenEvent) -> tuple[str, str | None]:
        """Text to emit and the finish reason, if this event ends the response."""
        now = time.monotonic()
        if self.completion_tokens:
            self.metrics.itl.observe(now - self.last_s)
        self.last_s = now
        self.completion_tokens += len(event.token_ids)
        reason = event.finish_reason
        text = self.detok.feed(event.token_ids, final=reason is not None)
        if self.detok.stopped and reason is None:
            self.loop.abort(self.handle)
            reason = "stop"
        if reason is not None:
            self.metrics.e2e.observe(now - self.handle.submitted_s)
            reason = reason if reason in ("stop", "length") else "error"
            self.finish_reason = reason
            self._log_done()
        return text, reason

    async def _events(self, first: TokenEvent) -> Any:
        event = first
        while True:
            text, reason = self._take(event)
            yield text, reason
            if reason is not None:
                return
            event = await self.handle.events.get()

    async def collect(self, first: TokenEvent) -> web.Response:
        finish: str | None = None
        async for _, reason in self._events(first):
            finish = reason
        return web.json_response(response_body(self.req, self.detok.text, finish, self.usage()))

    async def stream(self, request: web.Request, first: TokenEvent) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        try:
            async for text, reason in self._events(first):
                if text or reason is not None:
                    await _send(response, stream_chunk(self.req, text, reason))
            if self.req.include_usage:
                await _send(response, usage_chunk(self.req, self.usage()))
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        except ConnectionResetError:  # the client went away: stop generating, nothing to report
            self.loop.abort(self.handle)
        return response


async def _send(response: web.StreamResponse, chunk: dict[str, Any]) -> None:
    await response.write(f"data: {json.dumps(chunk)}\n\n".encode())


async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "completion")


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "chat")


async def models(request: web.Request) -> web.Response:
    engine = request.app[LOOP_KEY].engine
    card = {
        "id": engine.config.model.name,
        "object": "model",
        "owned_by": "strata",
        "created": 0,
        "max_model_len": engine.max_context,
    }
    return web.json_response({"object": "list", "data": [card]})


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


def build_app(loop: EngineLoop, drain: Drain | None = None) -> web.Application:
    """The app; starting it starts the engine loop thread, cleaning it up stops the thread.
    ``drain`` is the shutdown state that main.py's signal handling begins."""
    app = web.Application(middlewares=[request_ids, json_errors], client_max_size=64 * 2**20)
    app.on_response_prepare.append(echo_request_id)
    app[LOOP_KEY] = loop
    app[DRAIN_KEY] = drain or Drain()
    app[METRICS_KEY] = WorkerMetrics(loop)

    async def start(app: web.Application) -> None:
        import asyncio

        loop.start(asyncio.get_running_loop())

    async def stop(app: web.Application) -> None:
        import asyncio

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
