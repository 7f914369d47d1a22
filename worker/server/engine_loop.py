"""Drives the synchronous engine from a background thread for the asyncio HTTP server.

Only this thread touches the engine's mutable state; handlers hand requests and aborts over
through a locked inbox and receive token events on an asyncio queue, so a long prefill step
never blocks the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass, field

from strata.common.logs import REQUEST_ID
from strata.worker.engine.llm_engine import LLMEngine
from strata.worker.engine.scheduler import QueueFull
from strata.worker.engine.sequence import SamplingParams, Sequence, TokenLogprob

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TokenEvent:
    token_ids: list[int]
    # Set on the last event: stop, length, queue_timeout, queue_full, error, shutdown.
    finish_reason: str | None
    logprobs: list[TokenLogprob] = field(default_factory=list)  # of token_ids, when the request asked


@dataclass(eq=False)
class RequestHandle:
    token_ids: list[int]
    params: SamplingParams
    priority: int | None
    request_id: str | None = None  # for the log lines (and sidecar messages) made on its behalf
    events: asyncio.Queue[TokenEvent] = field(default_factory=asyncio.Queue)
    seq: Sequence | None = None
    submitted_s: float = field(default_factory=time.monotonic)


class EngineLoop:
    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._lock = threading.Lock()
        self._inbox: list[RequestHandle] = []
        self._aborts: list[RequestHandle] = []
        self._abort_all: str | None = None  # a finish reason: end everything in flight with it
        self._live: dict[int, RequestHandle] = {}
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self._loop: asyncio.AbstractEventLoop | None = None
        self.steps = 0
        self.pending_tokens = 0  # prompt tokens queued or mid-prefill, as of the last step

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stop.is_set()

    @property
    def num_waiting(self) -> int:
        return len(self.engine.scheduler.waiting) + len(self._inbox)

    @property
    def num_running(self) -> int:
        return len(self.engine.scheduler.running)

    def load_status(self) -> dict[str, float]:
        """What a router weighs: prompt tokens still to prefill here, and KV usage (any thread)."""
        pending = self.pending_tokens + sum(len(h.token_ids) for h in list(self._inbox))
        return {"pending_tokens": pending, "kv_usage": round(self.engine.blocks.usage, 4)}

    def _count_pending(self) -> None:
        scheduler = self.engine.scheduler
        seqs = list(scheduler.waiting) + list(scheduler.running)
        self.pending_tokens = sum(max(0, s.num_prompt_tokens - s.num_computed_tokens) for s in seqs)

    def submit(
        self,
        token_ids: list[int],
        params: SamplingParams,
        priority: int | None,
        request_id: str | None = None,
    ) -> RequestHandle:
        """Queue a request (already validated); raises QueueFull when the queue is at its limit."""
        limit = self.engine.config.engine.max_queue_len
        with self._lock:
            if self.num_waiting >= limit:
                raise QueueFull(f"queue is full ({limit} waiting)")
            handle = RequestHandle(token_ids, params, priority, request_id)
            self._inbox.append(handle)
        self._wake.set()
        return handle

    def abort(self, handle: RequestHandle) -> None:
        with self._lock:
            self._aborts.append(handle)
        self._wake.set()

    def abort_all(self, reason: str) -> None:
        """End every request in flight or queued with ``reason`` (the drain timed out)."""
        with self._lock:
            self._abort_all = reason
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._drain()
            self._count_pending()
            if not self.engine.has_unfinished():
                self._wake.wait(timeout=0.1)
                self._wake.clear()
                continue
            try:
                outputs = self.engine.step()
            except Exception:
                log.exception("engine step failed; failing the requests in flight")
                self._fail_all()
                continue
            self.steps += 1
            self._count_pending()
            for out in outputs:
                handle = self._live.get(out.seq.seq_id)
                if handle is None:
                    continue
                reason = out.seq.finish_reason if out.finished else None
                if out.finished:
                    del self._live[out.seq.seq_id]
                self._emit(handle, TokenEvent(out.new_token_ids, reason, out.new_logprobs))

    def _drain(self) -> None:
        with self._lock:
            inbox, self._inbox = self._inbox, []
            aborts, self._aborts = self._aborts, []
            abort_all, self._abort_all = self._abort_all, None
        if abort_all is not None:
            for handle in inbox:
                self._emit(handle, TokenEvent([], abort_all))
            self._fail_all(abort_all)
            return
        for handle in inbox:
            token = REQUEST_ID.set(handle.request_id)  # the connector's prefetch runs in here
            try:
                handle.seq = self.engine.add_request(handle.token_ids, handle.params, handle.priority)
            except QueueFull:
                self._emit(handle, TokenEvent([], "queue_full"))
            except ValueError:
                log.exception("request refused by the engine")
                self._emit(handle, TokenEvent([], "error"))
            else:
                self._live[handle.seq.seq_id] = handle
            finally:
                REQUEST_ID.reset(token)
        for handle in aborts:
            if handle.seq is not None and self._live.pop(handle.seq.seq_id, None) is not None:
                self.engine.abort(handle.seq.seq_id)

    def _fail_all(self, reason: str = "error") -> None:
        for seq_id, handle in list(self._live.items()):
            self.engine.abort(seq_id)
            self._emit(handle, TokenEvent([], reason))
        self._live.clear()

    def _emit(self, handle: RequestHandle, event: TokenEvent) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(handle.events.put_nowait, event)
