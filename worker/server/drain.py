"""Graceful shutdown bookkeeping: the generation requests in flight, and the drain after SIGTERM.

A deleted pod gets SIGTERM, then ``terminationGracePeriodSeconds`` before SIGKILL. During that
time the worker fails readiness, refuses new requests with 503, and lets every request it had
already accepted finish (queued ones and streams included), so scale-in and rollouts lose no
request. This module only counts; the signal handling and the server's stop live in main.py."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass
class Outcome:
    """One tracked request; the handler sets ``status`` once it has a response."""

    stream: bool = False
    status: int | None = None  # None: the handler never returned one (client gone, cancelled)


@dataclass(frozen=True)
class DrainSummary:
    in_flight_at_start: int
    finished: int  # answered during the drain (errors included)
    streams: int  # of those, streamed responses
    errors: int  # of those, answered with a status >= 400 or not at all
    aborted: int  # still running at the drain timeout, cut off
    seconds: float

    def fields(self) -> dict[str, float | int]:
        return {
            "in_flight_at_start": self.in_flight_at_start,
            "finished": self.finished,
            "streams": self.streams,
            "errors": self.errors,
            "aborted": self.aborted,
            "seconds": round(self.seconds, 3),
        }


class Drain:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.in_flight = 0
        self.in_flight_streams = 0
        self.started_s: float | None = None
        self._at_start = 0
        self._finished = self._streams = self._errors = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def draining(self) -> bool:
        return self.started_s is not None

    def begin(self) -> None:
        if self.started_s is None:
            self.started_s = self.clock()
            self._at_start = self.in_flight

    @contextmanager
    def track(self) -> Iterator[Outcome]:
        outcome = Outcome()
        self.in_flight += 1
        self._idle.clear()
        try:
            yield outcome
        finally:
            self._done(outcome)

    def mark_stream(self, outcome: Outcome) -> None:
        """The response turned out to be a stream (known once the handler prepared it)."""
        if not outcome.stream:
            outcome.stream = True
            self.in_flight_streams += 1

    def _done(self, outcome: Outcome) -> None:
        self.in_flight -= 1
        self.in_flight_streams -= outcome.stream
        if self.draining:
            self._finished += 1
            self._streams += outcome.stream
            self._errors += outcome.status is None or outcome.status >= 400
        if self.in_flight == 0:
            self._idle.set()

    async def wait_idle(self, timeout_s: float) -> bool:
        """True once nothing is in flight; False if the timeout came first."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    def summary(self, aborted: int) -> DrainSummary:
        started = self.started_s if self.started_s is not None else self.clock()
        return DrainSummary(
            in_flight_at_start=self._at_start,
            finished=self._finished,
            streams=self._streams,
            errors=self._errors,
            aborted=aborted,
            seconds=self.clock() - started,
        )
