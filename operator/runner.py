"""One reconcile at a time per service, coalescing triggers, retrying failures with jittered backoff.

Triggers come from many watches (the service, its children, its tier). A reconcile always reads
fresh state, so any number of triggers that arrive while one runs are served by a single rerun
after it: requesters share the pending run instead of queueing one each."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field

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


class KeyedRunner:
    def __init__(self, backoff: Backoff = Backoff()) -> None:
        self._slots: dict[Hashable, _Slot] = {}
        self._backoff = backoff
        self._tasks: set[asyncio.Task[None]] = set()

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
        try:
            async with slot.lock:
                chosen = job if slot.pending_job is None else slot.pending_job
                if slot.pending is pending:
                    slot.pending, slot.pending_job, slot.pending_level = None, None, 0
                ok = await self._attempt(chosen)
                self._schedule_retry(key, slot, chosen, ok)
        finally:
            if not pending.done():
                pending.set_result(None)

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
        slot.retry = asyncio.get_running_loop().call_later(delay, self._spawn, key, job)

    def _spawn(self, key: Hashable, job: Job) -> None:
        if key not in self._slots:
            return
        task = asyncio.get_running_loop().create_task(self.run(key, job))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        for slot in self._slots.values():
            if slot.retry is not None:
                slot.retry.cancel()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
