"""Forwarding one request along its fallback list, and streaming the answer back unbuffered.

Retries only where safe: a connection refused, reset or answered with garbage, an endpoint that
gives no response headers within ``timeouts.response_s``, one marked down while the request
waited on it, or a worker's draining 503 (``X-Strata-Draining: true``: it took nothing) all happen before
any byte went to the caller, so the request moves to the next endpoint (and the failed one is
marked down). Any other answer is the caller's, errors included (a worker's 400 or 429 is passed
back unchanged), and nothing is retried once it began.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from strata.common.openai.errors import DRAINING_HEADER
from strata.common.openai.request_id import HEADER as REQUEST_ID
from strata.router.fleet import DOWN_S, Endpoint, EndpointDown, Fleet
from strata.router.gate import Gate, Refused, Route
from strata.router.intake import Admitted
from strata.router.metrics import RouterMetrics

log = logging.getLogger(__name__)
PASSED_BACK = ("Content-Type", "Cache-Control", "Retry-After")


class Draining(Exception):
    """The worker answered 503: it is shutting down and took nothing; another one will."""


RETRYABLE = (aiohttp.ClientError, TimeoutError, EndpointDown, Draining, OSError)
TAP_BYTES = 1 << 20


@dataclass(frozen=True)
class Timeouts:
    connect_s: float
    response_s: float


class UsageTap:
    """Keeps enough of a relayed body to read the worker's ``usage`` at the end: the whole JSON
    body (up to ``TAP_BYTES``), or the tail of an event stream, where the usage chunk comes."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.truncated = False

    def feed(self, chunk: bytes) -> None:
        self.data += chunk
        if len(self.data) > TAP_BYTES:
            del self.data[: len(self.data) - TAP_BYTES // 16]
            self.truncated = True

    def cached_tokens(self) -> int | None:
        text = self.data.decode("utf-8", errors="replace")
        for candidate in self._bodies(text):
            try:
                details = json.loads(candidate)["usage"]["prompt_tokens_details"]
                return int(details["cached_tokens"])
            except (ValueError, KeyError, TypeError):
                continue
        return None

    def _bodies(self, text: str) -> list[str]:
        if text.lstrip().startswith("{") and not self.truncated:
            return [text]
        lines = [line[5:].strip() for line in text.splitlines() if line.startswith("data:")]
        return [line for line in reversed(lines) if '"usage"' in line]


class Forwarder:
    def __init__(
        self,
        session: aiohttp.ClientSession,
        fleet: Fleet,
        gate: Gate,
        metrics: RouterMetrics,
        timeouts: Timeouts,
    ) -> None:
        self.session, self.fleet, self.gate, self.metrics, self.timeouts = (
            session,
            fleet,
            gate,
            metrics,
            timeouts,
        )

    async def forward(
        self, request: web.Request, admitted: Admitted, route: Route, arrived: float
    ) -> web.StreamResponse:
        """Try the route's endpoints in order; the first holds the request's slot."""
        previous: Endpoint | None = None
        for endpoint in route.endpoints:
            if previous is not None:
                self.gate.moved(previous, endpoint)
            try:
                upstream = await self._attempt(endpoint, request.path, admitted)
            except RETRYABLE as exc:
                cause = _cause(exc)
                log.warning(
                    "endpoint %s failed before any byte (%s): trying the next", endpoint.name, exc or cause
                )
                self.fleet.mark_down(endpoint, cause, time.monotonic())
                self.metrics.endpoint_failures.labels(cause).inc()
                self.metrics.retries.labels(cause).inc()
                previous = endpoint
                continue
            try:
                return await self._relay(request, upstream, admitted, route, arrived, endpoint)
            finally:
                self.gate.finished(endpoint)
        if previous is not None:
            self.gate.finished(previous, completed=False)
        self.metrics.requests.labels(route.reason, "503").inc()
        tried = len(route.endpoints)
        # Every replica failed before any byte: the client may come back once they are tried again.
        message = f"no replica could take the request ({tried} tried)"
        raise Refused(503, message, math.ceil(DOWN_S), "no_replica")

    async def _attempt(self, endpoint: Endpoint, path: str, admitted: Admitted) -> aiohttp.ClientResponse:
        """POST to one endpoint; returns once its response headers are in."""
        loop = asyncio.get_running_loop()
        abandoned: asyncio.Future[None] = loop.create_future()
        endpoint.attempts.add(abandoned)
        headers = {"Content-Type": "application/json", REQUEST_ID: admitted.request_id, **admitted.passed_on}
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.timeouts.connect_s)
        post = asyncio.ensure_future(
            self.session.post(
                endpoint.address.url + path, data=admitted.body, headers=headers, timeout=timeout
            )
        )
        try:
            waiting: set[asyncio.Future[Any]] = {post, abandoned}
            done, _ = await asyncio.wait(
                waiting, timeout=self.timeouts.response_s, return_when=asyncio.FIRST_COMPLETED
            )
            if post in done:
                return _refuse_draining(post.result())
            if abandoned in done:
                abandoned.result()  # raises EndpointDown
            raise TimeoutError(f"no response within {self.timeouts.response_s:g}s")
        finally:
            endpoint.attempts.discard(abandoned)
            if abandoned.done() and not abandoned.cancelled():
                abandoned.exception()  # marked down after the answer came: seen, nothing to raise
            if not post.done():
                post.cancel()
            if not abandoned.done():
                abandoned.cancel()

    async def _relay(
        self,
        request: web.Request,
        upstream: aiohttp.ClientResponse,
        admitted: Admitted,
        route: Route,
        arrived: float,
        endpoint: Endpoint,
    ) -> web.StreamResponse:
        out = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        for name in PASSED_BACK:
            if name in upstream.headers:
                out.headers[name] = upstream.headers[name]
        if upstream.content_length is not None:
            out.content_length = upstream.content_length
        tap = UsageTap()
        code = str(upstream.status)
        if upstream.status == 200:  # the worker computes (and caches) the prompt's blocks first
            endpoint.view.routed(admitted.prompt.blocks, time.monotonic())
        try:
            await out.prepare(request)
            first = True
            async for chunk in upstream.content.iter_any():
                if first:
                    self.metrics.ttft.labels(str(admitted.api.stream).lower()).observe(
                        time.monotonic() - arrived
                    )
                    first = False
                tap.feed(chunk)
                await out.write(chunk)
            await out.write_eof()
        except aiohttp.ClientPayloadError as exc:  # the worker died mid-answer: nothing to retry
            log.warning("endpoint answer cut off after streaming began: %s", exc)
            code = "aborted"
        finally:
            upstream.close()  # a caller who left mid-stream: the worker sees it and stops
            self.metrics.requests.labels(route.reason, code).inc()
            self.metrics.latency.observe(time.monotonic() - arrived)
            predicted = route.predicted_cached.get(endpoint.name, 0)
            cached = self._count_cached(tap, predicted)
            log.info(
                "request routed",
                extra={
                    "endpoint": endpoint.name,
                    "reason": route.reason,
                    "status": code,
                    "queued_s": round(route.queued_s, 4),
                    "predicted_cached_tokens": predicted,
                    "cached_tokens": cached,
                    "e2e_s": round(time.monotonic() - arrived, 4),
                },
            )
        return out

    def _count_cached(self, tap: UsageTap, predicted: int) -> int | None:
        cached = tap.cached_tokens()
        if cached is not None:
            self.metrics.cached.inc(cached)
            self.metrics.predicted_cached.inc(predicted)
        return cached


def _refuse_draining(response: aiohttp.ClientResponse) -> aiohttp.ClientResponse:
    """A draining worker's 503 says so in a header: that request never ran, another replica may
    take it. Any other 503 may come after work was done and goes back to the caller."""
    if response.status == 503 and response.headers.get(DRAINING_HEADER) == "true":
        response.release()
        raise Draining(f"{response.url.host}: 503, draining")
    return response


def _cause(exc: BaseException) -> str:
    if isinstance(exc, EndpointDown):
        return "marked_down"
    if isinstance(exc, Draining):
        return "draining"
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return "refused"
    if isinstance(exc, aiohttp.ClientResponseError):
        return "garbage"
    return "reset"
