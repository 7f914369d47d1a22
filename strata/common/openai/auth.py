"""The optional API key on ``/v1/`` (``Authorization: Bearer <key>``), for the worker and the
router alike: a caller without it gets the same 401 from either. Torch-free (the router imports
it)."""

from __future__ import annotations

import hmac

from aiohttp import web
from aiohttp.typedefs import Middleware

from strata.common.openai.errors import ApiError, Handler, error_response

MISSING_KEY = "invalid or missing API key: send Authorization: Bearer <key>"


def api_key_check(api_key: str) -> Middleware:
    """``Authorization: Bearer <key>`` on the API routes, compared in constant time; probes and
    Prometheus (``/health``, ``/ready``, ``/metrics``) need none."""
    expected = f"Bearer {api_key}".encode()

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        given = request.headers.get("Authorization", "").encode()
        if request.path.startswith("/v1/") and not hmac.compare_digest(given, expected):
            return error_response(ApiError(401, MISSING_KEY, kind="authentication_error"))
        return await handler(request)

    return check
