"""One reconcile at a time per service, coalescing triggers, retrying failures with jittered backoff.

Triggers come from many watches (the service, its children, its tier). A reconcile always reads
fresh state, so any number of triggers that arrive while one runs are served by a single rerun
after it: requesters share the pending run instead of queueing one each.

At most ``workers`` jobs run at once over all keys (FIFO): a burst of a thousand new services
queues as a thousand keys, not as a thousand half-done reconciles each holding its rendered
children while it waits for the API client. :meth:`submit` is what a watch handler calls: it
returns at once, so the handler does not hold its event while the reconcile waits its turn."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from strata.operator.backoff import Backoff

log = logging.getLogger(__name__)

Job = Callable[[], Awaitable[bool]]  # returns True when converged, False to retry later


@dataclass
class _Slot:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    pending: asyncio.Future[None] | None = None
    # The job the pending run will execute: the strongest any requester asked for.
    pending_job: Job | None = None
    pending_level: int = 0
    retry: asyncio.TimerHandle | None = None
    attempt: int = 0
    asked: float = 0.0  # when the pending run was first asked for


def _unobserved(seconds: float) -> None:
    pass


class KeyedRunner:
    def __init__(
        self,
        backoff: Backoff = Backoff(),
        workers: int | None = None,
        on_wait: Callable[[float], None] = _unobserved,
    ) -> None:
        self._slots: dict[Hashable, _Slot] = {}
        self._backoff = backoff
        self._tasks: set[asyncio.Task[None]] = set()
        self._workers = asyncio.Semaphore(workers) if workers else None
        self._on_wait = on_wait  # seconds from the first trigger of a run to its start

    def keys(self) -> list[Hashable]:
        return list(self._slots)

    def forget(self, key: Hashable) -> None:
        slot = self._slots.pop(key, None)
        if slot is not None and slot.retry is not None:
            slot.retry.cancel()

    async def run(self, key: Hashable, job: Job, level: int = 1) -> None:
        """Run ``job`` for ``key`` after any running one. A job of a higher ``level`` does more
        (a full reconcile rather than a status refresh) and so may stand in for lower ones."""
        slot = self._slots.setdefault(key, _Slot())
        if slot.pending is not None:
            if level > slot.pending_level:
                slot.pending_job, slot.pending_level = job, level
            await asyncio.shield(slot.pending)  # a run not yet started will see our trigger too
            return
        pending: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        slot.pending, slot.pending_job, slot.pending_level = pending, job, level
        slot.asked = time.monotonic()
        try:
            async with slot.lock, self._worker():
                chosen = job if slot.pending_job is None else slot.pending_job
                if slot.pending is pending:
                    slot.pending, slot.pending_job, slot.pending_level = None, None, 0
                self._on_wait(time.monotonic() - slot.asked)
                ok = await self._attempt(chosen)
                self._schedule_retry(key, slot, chosen, ok)
        finally:
            if not pending.done():
                pending.set_result(None)

    def submit(self, key: Hashable, job: Job, level: int = 1) -> None:
        """Ask for a run of ``job`` without waiting for it: joins the pending run if there is
        one (raising its level), else starts one in the background."""
        slot = self._slots.setdefault(key, _Slot())  # known from now on (keys(), the gauge)
        if slot.pending is not None:
            if level > slot.pending_level:
                slot.pending_job, slot.pending_level = job, level
            return
        self._start(key, job, level)

    def _worker(self) -> contextlib.AbstractAsyncContextManager[Any]:
        return self._workers if self._workers is not None else contextlib.nullcontext()

    async def _attempt(self, job: Job) -> bool:
        try:
            return await job()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("reconcile failed")
            return False

    def _schedule_retry(self, key: Hashable, slot: _Slot, job: Job, ok: bool) -> None:
        if slot.retry is not None:
            slot.retry.cancel()
            slot.retry = None
        if ok or slot.attempt >= self._backoff.attempts:
            slot.attempt = 0
            return
        delay = self._backoff.delay(slot.attempt)
        slot.attempt += 1
        slot.retry = asyncio.get_running_loop().call_later(delay, self._retry, key, job)

    def _retry(self, key: Hashable, job: Job) -> None:
        if key in self._slots:  # not forgotten meanwhile
            self._start(key, job, 1)

    def _start(self, key: Hashable, job: Job, level: int) -> None:
        task = asyncio.get_running_loop().create_task(self.run(key, job, level))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        for slot in self._slots.values():
            if slot.retry is not None:
                slot.retry.cancel()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
