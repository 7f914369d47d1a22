"""The router's HTTP face: the OpenAI API (validated here, forwarded to a worker), the model
card, health, readiness and metrics. Every refusal is an OpenAI-shaped error, as the worker's."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from aiohttp import web
from aiohttp.typedefs import Middleware

from strata.common.openai.auth import api_key_check
from strata.common.openai.errors import error_response, json_errors
from strata.common.openai.model_list import model_list
from strata.common.openai.protocol import ApiError, Kind
from strata.common.openai.request_id import REQUEST_ID_KEY, echo_request_id, request_ids
from strata.router.gate import Gate, Refused
from strata.router.intake import Intake
from strata.router.metrics import RouterMetrics
from strata.router.proxy import Forwarder

log = logging.getLogger(__name__)
BODY_LIMIT = 64 * 2**20  # as the workers'
HEADER_PARSE_LIMIT = 64 * 1024  # parse larger headers than allowed, to refuse them in OpenAI's shape


@dataclass(frozen=True)
class Parts:
    intake: Intake
    gate: Gate
    forwarder: Forwarder
    metrics: RouterMetrics


PARTS = web.AppKey("parts", Parts)


async def _generate(request: web.Request, kind: Kind) -> web.StreamResponse:
    # One id per request, made once (the request_ids middleware, as the worker's): the worker gets
    # it, the caller gets it back, and every log line of the request (router and worker) has it.
    rid = request[REQUEST_ID_KEY]
    arrived = time.monotonic()
    parts = request.app[PARTS]
    try:
        admitted = parts.intake.admit(await request.read(), kind, request.headers, rid)
        route = await parts.gate.enter(admitted.prompt, admitted.priority)
    except ApiError as err:
        parts.metrics.requests.labels("invalid", str(err.status)).inc()
        return _error(err)
    except Refused as refused:
        parts.metrics.requests.labels(refused.reason, str(refused.status)).inc()
        kind_ = "rate_limit_error" if refused.status == 429 else "server_error"
        return _error(ApiError(refused.status, refused.message, kind=kind_), refused.retry_after_s)
    parts.metrics.queue.labels(str(admitted.priority)).observe(route.queued_s)
    try:
        return await parts.forwarder.forward(request, admitted, route, arrived)
    except ApiError as err:
        return _error(err)
    except Refused as refused:  # every replica failed before any byte (counted by the forwarder)
        return _error(ApiError(refused.status, refused.message, kind="server_error"), refused.retry_after_s)


def _error(err: ApiError, retry_after_s: int | None = None) -> web.Response:
    """The router's own answer (nothing was forwarded), logged under the request's id."""
    log.info("request refused", extra={"status": err.status, "param": err.param, "reason": str(err)})
    return error_response(err, retry_after_s)


async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "completion")


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "chat")


async def models(request: web.Request) -> web.Response:
    model = request.app[PARTS].intake.config.model
    return web.json_response(model_list(model.name, model.max_context_tokens))


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def metrics_endpoint(request: web.Request) -> web.Response:
    body = request.app[PARTS].metrics.render()
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


def build_app(parts: Parts, api_key: str | None = None) -> web.Application:
    """``api_key``, when given (``STRATA_API_KEY``, the workers' own), is checked at the door as
    the workers check it; the caller's ``Authorization`` goes on to the worker either way."""
    middlewares: list[Middleware] = [request_ids, json_errors]
    if api_key:
        middlewares.append(api_key_check(api_key))
    app = web.Application(
        middlewares=middlewares,
        client_max_size=BODY_LIMIT,
        handler_args={"max_field_size": HEADER_PARSE_LIMIT, "max_line_size": HEADER_PARSE_LIMIT},
    )
    app.on_response_prepare.append(echo_request_id)
    app[PARTS] = parts
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/ready", health)  # a router with no replica is still ready: it holds requests
    app.router.add_get("/metrics", metrics_endpoint)
    return app
