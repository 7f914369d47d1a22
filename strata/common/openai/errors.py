"""OpenAI-shaped errors: every bad field names itself (``param``) and the reason; and the HTTP
responses that carry them, written in one place for the worker and the router. Torch-free."""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

log = logging.getLogger(__name__)
# Set on the 503 a draining worker answers: the request never ran, so a router may send it to
# another replica (unlike other 5xx, which may come after work was done).
DRAINING_HEADER = "X-Strata-Draining"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ApiError(Exception):
    def __init__(
        self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error"
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": None}}


def bad(param: str, reason: str) -> ApiError:
    return ApiError(400, f"{param}: {reason}", param)


def error_response(err: ApiError, retry_after_s: int | None = None) -> web.Response:
    headers = {"Retry-After": str(retry_after_s)} if retry_after_s is not None else None
    return web.json_response(err.body(), status=err.status, headers=headers)


def retry_after_s(queue_timeout_s: float) -> int:
    """A hint, not a promise: a fraction of how long the queue may take to move."""
    return max(1, math.ceil(queue_timeout_s / 10))


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """HTTP errors (404, 405, 413, ...) and anything unexpected, as OpenAI-shaped JSON."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error_response(ApiError(exc.status, f"{request.method} {request.path}: {exc.reason}"))
    except Exception:
        log.exception("unhandled error in %s %s", request.method, request.path)
        return error_response(ApiError(500, "internal error", kind="server_error"))
