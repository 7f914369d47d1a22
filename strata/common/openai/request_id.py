"""The request id that joins one request's log lines across router, worker and sidecar.

A caller (the router, a gateway, a client) may send ``X-Request-Id``; a well-formed value is
kept, anything else (absent, too long, odd characters that could forge log fields) is replaced
by a fresh id. The worker echoes it in the response's ``X-Request-Id`` header and builds the
response ``id`` from it (``cmpl-<id>``, ``chatcmpl-<id>``), as vLLM does. Torch-free: the router
uses the same middleware.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping

from aiohttp import web

from strata.common.logs import REQUEST_ID
from strata.common.openai.errors import Handler

HEADER = "X-Request-Id"
REQUEST_ID_KEY = web.RequestKey("request_id", str)
_WELL_FORMED = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def new_request_id() -> str:
    return uuid.uuid4().hex


def request_id(headers: Mapping[str, str]) -> str:
    """The caller's id when well formed, else a new one."""
    given = headers.get(HEADER, "")
    return given if _WELL_FORMED.fullmatch(given) else new_request_id()


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
    """Before headers go out (a stream prepares its response inside the handler), so every
    answer carries it, errors and refusals included."""
    rid = request.get(REQUEST_ID_KEY)
    if rid is not None:
        response.headers[HEADER] = rid
