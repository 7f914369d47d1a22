"""When to give up on an API call, when to try again, and how many to send at once: pure rules.

A busy API server answers slowly, not never. Request timeouts therefore follow the latency the
server shows now (a multiple of the recent 95th percentile, between a floor and a ceiling), and
a call that times out, loses its connection or is told 429/5xx is retried after an exponential
back-off with jitter: many callers that failed together spread out instead of retrying in
lockstep (a retry storm). Only when the retries are spent does the caller see the failure. And
an overloaded server is sent fewer requests at once (:class:`AdaptiveLimit`): work it would
time out on is work it does for nothing."""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

RETRY_STATUSES = {429: "throttled", 500: "server", 502: "server", 503: "server", 504: "server"}


@dataclass(frozen=True)
class Backoff:
    first_s: float = 2.0
    max_s: float = 60.0
    attempts: int = 8

    def ceiling(self, attempt: int) -> float:
        """The longest wait before retry ``attempt`` (0-based): doubling up to ``max_s``."""
        return min(self.max_s, self.first_s * 2.0**attempt)

    def delay(self, attempt: int, draw: Callable[[], float] = random.random) -> float:
        """Between half the ceiling and the ceiling ("equal jitter"): spread out, never zero."""
        ceiling = self.ceiling(attempt)
        return ceiling / 2 + draw() * ceiling / 2


@dataclass
class LatencyTimeout:
    """A request timeout sized to the API server's recent latency."""

    floor_s: float = 10.0
    ceiling_s: float = 120.0
    factor: float = 4.0
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=256))

    def observe(self, seconds: float) -> None:
        """Record the latency of a request that got an answer, or the timeout of one that did
        not (its latency was at least that): when more than one request in twenty times out,
        the 95th percentile, and so the timeout, grows."""
        self.recent.append(seconds)

    def current(self) -> float:
        if not self.recent:
            return self.floor_s
        ordered = sorted(self.recent)
        p95 = ordered[int(0.95 * (len(ordered) - 1))]
        return max(self.floor_s, min(self.ceiling_s, self.factor * p95))  # a floor above the ceiling wins

    def for_attempt(self, attempt: int) -> float:
        """A retried request waits twice as long as its previous attempt: a call that is merely
        slow gets through even before the percentile has caught up."""
        return max(self.floor_s, min(self.ceiling_s, self.current() * 2.0**attempt))


@dataclass
class AdaptiveLimit:
    """Requests allowed in flight: halved when the server shows overload (a timeout, 429, 5xx;
    at most once per ``cooldown_s``, since one overload fails many requests at once), grown back
    by one for every ``limit`` answers, up to ``ceiling`` (additive increase, multiplicative
    decrease, as TCP does)."""

    ceiling: int
    cooldown_s: float = 1.0
    value: float = 0.0
    last_cut: float = float("-inf")

    def __post_init__(self) -> None:
        self.value = float(self.ceiling)

    @property
    def limit(self) -> int:
        return max(1, int(self.value))

    def overloaded(self, now: float) -> None:
        if now - self.last_cut >= self.cooldown_s:
            self.value, self.last_cut = max(1.0, self.value / 2), now

    def answered(self) -> None:
        self.value = min(float(self.ceiling), self.value + 1 / self.value)


def retry_reason(status: int) -> str | None:
    """Why an HTTP status is worth retrying (None: it is an answer, retrying changes nothing)."""
    return RETRY_STATUSES.get(status)


def retry_after_s(header: str | None, cap_s: float) -> float:
    """The server's Retry-After in seconds (0 when absent or not a number of seconds), capped."""
    try:
        return min(cap_s, max(0.0, float(header))) if header else 0.0
    except ValueError:
        return 0.0
