"""A replay on a thread of its own, for synchronous callers (the end-to-end tests): start it, look
at what the clients saw so far, stop it. Stopping sends nothing more and waits for the requests in
flight to finish, so a clean stop never turns into a client error."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Sequence

import openai

from strata.loadgen.replay import replay
from strata.loadgen.summary import Outcome
from strata.loadgen.trace import TimedRequest

STOP_WITHIN_S = 600.0  # in-flight requests finish within their own timeouts; this only bounds a hang


class BackgroundLoad:
    def __init__(self, base_url: str, model: str, requests: Sequence[TimedRequest], timeout_s: float = 300):
        self.base_url, self.model, self.requests, self.timeout_s = base_url, model, requests, timeout_s
        self._done: list[Outcome] = []
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._stop = asyncio.Event()
        self._thread = threading.Thread(target=self._run, name="background-load", daemon=True)

    def start(self) -> BackgroundLoad:
        self._thread.start()
        return self

    def outcomes(self) -> list[Outcome]:
        with self._lock:
            return list(self._done)

    def stop(self) -> list[Outcome]:
        """Send nothing more; every outcome once the requests in flight have finished. Stopping
        a stopped load (or one that has sent everything) returns its outcomes again."""
        with contextlib.suppress(RuntimeError):  # its loop is closed: the replay has ended
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(STOP_WITHIN_S)
        if self._thread.is_alive():
            raise TimeoutError(f"the load's requests in flight did not finish within {STOP_WITHIN_S:.0f} s")
        return self.outcomes()

    def _record(self, outcome: Outcome) -> None:
        with self._lock:
            self._done.append(outcome)

    def _run(self) -> None:
        self._loop.run_until_complete(self._replay())
        self._loop.close()

    async def _replay(self) -> None:
        client = openai.AsyncOpenAI(
            base_url=self.base_url, api_key="unused", max_retries=0, timeout=self.timeout_s
        )
        async with client:
            await replay(client, self.model, self.requests, self._record, stop=self._stop)
