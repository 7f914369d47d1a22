"""The optional API key on ``/v1/`` (``Authorization: Bearer <key>``), for the worker and the
router alike: a caller without it gets the same 401 from either. Torch-free (the router imports
it)."""

from __future__ import annotations

import hmac
from collections.abc import Mapping

from aiohttp import web
from aiohttp.typedefs import Middleware

from strata.common.openai.errors import ApiError, Handler, error_response

MISSING_KEY = "invalid or missing API key: send Authorization: Bearer <key>"
API_KEY_ENV = "STRATA_API_KEY"


def api_key_from(environ: Mapping[str, str]) -> str | None:
    """The key ``STRATA_API_KEY`` requires, None where it is unset. Surrounding whitespace (a
    Secret made from a file ends in a newline) is not part of it; set but blank is refused
    (ValueError naming it), never taken for no key: its owner meant the API to be closed."""
    raw = environ.get(API_KEY_ENV)
    if raw is None:
        return None
    key = raw.strip()
    if not key:
        raise ValueError(f"{API_KEY_ENV} is set but empty: give the key, or unset it to serve without one")
    return key


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
