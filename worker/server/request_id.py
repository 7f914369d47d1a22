"""The request id that joins one request's log lines across router, worker and sidecar.

A caller (the router, a gateway, a client) may send ``X-Request-Id``; a well-formed value is
kept, anything else (absent, too long, odd characters that could forge log fields) is replaced
by a fresh id. The worker echoes it in the response's ``X-Request-Id`` header and builds the
response ``id`` from it (``cmpl-<id>``, ``chatcmpl-<id>``), as vLLM does. Torch-free: the router
imports it.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping

HEADER = "X-Request-Id"
_WELL_FORMED = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def new_request_id() -> str:
    return uuid.uuid4().hex


def request_id(headers: Mapping[str, str]) -> str:
    """The caller's id when well formed, else a new one."""
    given = headers.get(HEADER, "")
    return given if _WELL_FORMED.fullmatch(given) else new_request_id()
