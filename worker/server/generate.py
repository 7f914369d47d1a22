"""The completions and chat completions handlers: validate, hand the request to the engine
loop, and relay its token events as one JSON response or an SSE stream."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from strata.common.openai.errors import DRAINING_HEADER, ApiError, error_response, retry_after_s
from strata.common.openai.protocol import ApiRequest, Kind, parse_request
from strata.common.openai.request_id import REQUEST_ID_KEY
from strata.worker import request_limits
from strata.worker.engine.scheduler import QueueFull
from strata.worker.engine.sequence import SamplingParams, TokenLogprob
from strata.worker.models.generation import GenerationDefaults
from strata.worker.request_limits import RequestError
from strata.worker.server.detok import Detokenizer, shown_tokens
from strata.worker.server.drain import Drain, Outcome
from strata.worker.server.engine_loop import EngineLoop, RequestHandle, TokenEvent
from strata.worker.server.metrics import WorkerMetrics
from strata.worker.server.responses import LogprobsFormat, response_body, stream_chunk, usage, usage_chunk

log = logging.getLogger(__name__)
LOOP_KEY = web.AppKey("engine_loop", EngineLoop)
METRICS_KEY = web.AppKey("metrics", WorkerMetrics)
DRAIN_KEY = web.AppKey("drain", Drain)
REFUSED = {"queue_timeout": 429, "queue_full": 429, "error": 500, "shutdown": 503}
DRAINING_MESSAGE = "server shutting down: this replica is draining and takes no new requests; retry another"


def _first(*values: Any) -> Any:
    return next(v for v in values if v is not None)


def sampling_params(req: ApiRequest, gen: GenerationDefaults, room: int) -> SamplingParams:
    """The request's settings, else the model's generation_config.json, else OpenAI's defaults;
    ``room``: context left after the prompt."""
    return SamplingParams(
        max_tokens=request_limits.max_tokens(req.kind, req.max_tokens, gen.max_tokens, room),
        temperature=_first(req.temperature, gen.temperature, 1.0),
        top_p=_first(req.top_p, gen.top_p, 1.0),
        top_k=_first(req.top_k, gen.top_k, 0),
        seed=req.seed,
        ignore_eos=req.ignore_eos,
        stop_token_ids=req.stop_token_ids,
        logprobs=req.logprobs,
    )


def _prepare(loop: EngineLoop, req: ApiRequest) -> tuple[list[int], SamplingParams]:
    engine = loop.engine
    if isinstance(req.prompt, str):
        token_ids = engine.tokenizer.encode(req.prompt, add_special_tokens=not req.templated)
    else:
        token_ids = req.prompt
    params = sampling_params(req, engine.generation, engine.max_context - len(token_ids))
    try:
        engine.validate(token_ids, params)
    except RequestError as exc:
        raise ApiError(400, str(exc), exc.field) from exc
    return token_ids, params


def draining_response() -> web.Response:
    """503 for work that arrives (or was cut off) while the replica shuts down; Connection:
    close so a keep-alive client's retry opens a new connection, to another replica."""
    response = error_response(ApiError(503, DRAINING_MESSAGE, kind="service_unavailable"), 1)
    response.headers[DRAINING_HEADER] = "true"
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


async def generate(request: web.Request, kind: Kind) -> web.StreamResponse:
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
        handle = loop.submit(token_ids, params, req.priority, req.request_id)
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
        metrics.first_token(time.monotonic() - handle.submitted_s)
        relay = Relay(loop, metrics, req, handle, len(token_ids))
        response = await (relay.stream(request, first) if req.stream else relay.collect(first))
        finished = True
        return response
    finally:
        if not finished:  # the client went away (handler cancelled) before the end
            loop.abort(handle)
            metrics.finished("abort", None)


class Relay:
    """Turns one request's token events into a JSON response or an SSE stream."""

    def __init__(
        self, loop: EngineLoop, metrics: WorkerMetrics, req: ApiRequest, handle: RequestHandle, n: int
    ):
        self.loop, self.metrics, self.req, self.handle = loop, metrics, req, handle
        self.detok = Detokenizer(loop.engine.tokenizer, req.stop)
        self.logprobs = LogprobsFormat(loop.engine.tokenizer, req)
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
                "user": self.req.user,
            },
        )

    def _take(self, event: TokenEvent) -> tuple[str, str | None]:
        """Text to emit and the finish reason, if this event ends the response."""
        now = time.monotonic()
        if self.completion_tokens:
            self.metrics.next_token(now - self.last_s)
        self.last_s = now
        self.completion_tokens += len(event.token_ids)
        reason = event.finish_reason
        text = self.detok.feed(shown_tokens(event.token_ids, reason), final=reason is not None)
        if self.detok.stopped and reason is None:
            self.loop.abort(self.handle)
            reason = "stop"
        if reason is not None:
            reason = reason if reason in ("stop", "length") else "error"
            self.metrics.finished(reason, now - self.handle.submitted_s)
            self.finish_reason = reason
            self._log_done()
        return text, reason

    async def _events(self, first: TokenEvent) -> AsyncIterator[tuple[str, str | None, list[TokenLogprob]]]:
        event = first
        while True:
            text, reason = self._take(event)
            yield text, reason, event.logprobs
            if reason is not None:
                return
            event = await self.handle.events.get()

    async def collect(self, first: TokenEvent) -> web.Response:
        finish: str | None = None
        entries: list[TokenLogprob] = []
        async for _, reason, logprobs in self._events(first):
            finish = reason
            entries += logprobs
        logprobs_body = self.logprobs.body(entries)
        body = response_body(self.req, self.detok.text, finish, logprobs_body, self.usage())
        return web.json_response(body)

    async def stream(self, request: web.Request, first: TokenEvent) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        try:
            async for text, reason, logprobs in self._events(first):
                if text or logprobs or reason is not None:
                    await _send(response, stream_chunk(self.req, text, reason, self.logprobs.body(logprobs)))
            if self.req.include_usage:
                await _send(response, usage_chunk(self.req, self.usage()))
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        except ConnectionResetError:  # the client went away: stop generating, nothing to report
            self.loop.abort(self.handle)
            if self.finish_reason is None:
                self.metrics.finished("abort", None)
        return response


async def _send(response: web.StreamResponse, chunk: dict[str, Any]) -> None:
    await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
