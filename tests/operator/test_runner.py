"""KeyedRunner: one reconcile at a time per key, triggers coalesced, failures retried."""

from __future__ import annotations

import asyncio

from strata.operator.backoff import Backoff
from strata.operator.runner import KeyedRunner


async def test_triggers_during_a_run_coalesce_into_one_rerun():
    runner = KeyedRunner()
    started, release = asyncio.Event(), asyncio.Event()
    runs = 0

    async def job() -> bool:
        nonlocal runs
        runs += 1
        started.set()
        await release.wait()
        return True

    first = asyncio.create_task(runner.run("a", job))
    await started.wait()
    waiters = [asyncio.create_task(runner.run("a", job)) for _ in range(5)]
    await asyncio.sleep(0)
    release.set()
    await asyncio.gather(first, *waiters)
    assert runs == 2


async def test_different_keys_run_concurrently():
    runner = KeyedRunner()
    both = asyncio.Barrier(2)

    async def job() -> bool:
        await asyncio.wait_for(both.wait(), 2)
        return True

    await asyncio.gather(runner.run("a", job), runner.run("b", job))


async def test_failures_are_retried_with_backoff_until_success():
    runner = KeyedRunner(Backoff(first_s=0.01, max_s=0.02, attempts=5))
    outcomes = [False, False, True]
    done = asyncio.Event()

    async def job() -> bool:
        ok = outcomes.pop(0)
        if ok:
            done.set()
        return ok

    await runner.run("a", job)
    await asyncio.wait_for(done.wait(), 2)
    assert outcomes == []
    await runner.close()


async def test_exceptions_count_as_failures_and_forget_stops_retries():
    runner = KeyedRunner(Backoff(first_s=0.05, max_s=0.05, attempts=3))
    calls = 0

    async def job() -> bool:
        nonlocal calls
        calls += 1
        raise RuntimeError("boom")

    await runner.run("a", job)
    runner.forget("a")
    await asyncio.sleep(0.2)
    assert calls == 1
    await runner.close()


def test_backoff_doubles_up_to_the_cap_with_jitter_in_its_upper_half():
    b = Backoff(first_s=1, max_s=5)
    assert [b.ceiling(i) for i in range(5)] == [1, 2, 4, 5, 5]
    assert [b.delay(i, draw=lambda: 0.0) for i in range(3)] == [0.5, 1, 2]
    assert [b.delay(i, draw=lambda: 1.0) for i in range(3)] == [1, 2, 4]


class Jobs:
    """Jobs that record their name, say they started, and wait for ``release``."""

    def __init__(self) -> None:
        self.started, self.release = asyncio.Event(), asyncio.Event()
        self.ran: list[str] = []

    def named(self, name: str):
        async def run() -> bool:
            self.ran.append(name)
            self.started.set()
            await self.release.wait()
            return True

        return run


async def test_a_stronger_job_replaces_a_weaker_pending_one():
    runner, jobs = KeyedRunner(), Jobs()
    job, started, release, ran = jobs.named, jobs.started, jobs.release, jobs.ran

    first = asyncio.create_task(runner.run("a", job("first"), level=1))
    await started.wait()
    weak = asyncio.create_task(runner.run("a", job("status"), level=1))
    await asyncio.sleep(0)
    strong = asyncio.create_task(runner.run("a", job("full"), level=2))
    await asyncio.sleep(0)
    weaker = asyncio.create_task(runner.run("a", job("status-again"), level=1))
    release.set()
    await asyncio.gather(first, weak, strong, weaker)
    assert ran == ["first", "full"]


async def test_submit_returns_at_once_and_joins_a_pending_run():
    runner, jobs = KeyedRunner(), Jobs()
    job, started, release, ran = jobs.named, jobs.started, jobs.release, jobs.ran

    runner.submit("a", job("first"))
    assert runner.keys() == ["a"]  # managed from the trigger on, before its run starts
    await started.wait()
    for name in ("second", "third", "fourth"):
        runner.submit("a", job(name))  # joins the one pending rerun (the first asker's job)
    release.set()
    await asyncio.wait_for(asyncio.gather(*runner._tasks), 5)
    assert ran == ["first", "second"]
    await runner.close()


async def test_workers_bound_the_jobs_running_at_once_and_queue_waits_are_reported():
    waits: list[float] = []
    runner = KeyedRunner(workers=2, on_wait=waits.append)
    running, most = 0, 0
    release, two = asyncio.Event(), asyncio.Event()

    async def job() -> bool:
        nonlocal running, most
        running += 1
        most = max(most, running)
        if running == 2:
            two.set()
        await release.wait()
        running -= 1
        return True

    for key in range(6):
        runner.submit(key, job)
    await asyncio.wait_for(two.wait(), 5)
    await asyncio.sleep(0.05)
    assert running == 2  # the other four wait their turn
    release.set()
    await asyncio.wait_for(asyncio.gather(*runner._tasks), 5)
    assert most == 2 and len(waits) == 6
    assert max(waits) >= 0.05 > min(waits)  # the queued ones waited for the first two
    await runner.close()
