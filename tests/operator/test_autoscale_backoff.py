"""The per-pod back-off of failing metrics endpoints: pure, then through the loop against a pod
IP that refuses and a real metrics endpoint that comes up later."""

from __future__ import annotations

import itertools

from strata.operator.autoscale.backoff import BACKOFF_CAP_S, ScrapeBackoff
from tests.operator.pod_ips import NOBODY
from tests.operator.test_autoscale_loop import FakeKube, autoscaler, metrics_server


def test_failures_double_the_wait_up_to_the_cap_and_one_success_clears_them() -> None:
    b = ScrapeBackoff(base_s=5, cap_s=120)
    assert b.due("p", 0.0)
    assert [b.delay_s(n) for n in range(1, 8)] == [5, 10, 20, 40, 80, 120, 120]
    assert b.failed("p", 100.0) == 1
    assert not b.due("p", 104.9) and b.due("p", 105.0)
    b.failed("p", 105.0)
    b.failed("p", 115.0)  # third in a row: 20 s
    assert not b.due("p", 134.0) and b.due("p", 135.0)
    assert b.succeeded("p") == 3
    assert b.due("p", 0.0) and b.failures("p") == 0
    assert b.succeeded("p") == 0


def test_pods_gone_from_every_service_are_forgotten() -> None:
    b = ScrapeBackoff()
    b.failed("a", 0.0)
    b.failed("b", 0.0)
    b.forget({"b"})
    assert b.failures("a") == 0 and b.due("a", 0.0)
    assert b.failures("b") == 1 and not b.due("b", 0.0)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_a_refusing_pod_is_scraped_less_and_less_then_again_when_it_answers() -> None:
    kube = FakeKube("off")
    scaler = autoscaler(kube, NOBODY)
    clock = Clock()
    scaler.clock = clock
    attempts: list[float] = []
    real_get = scaler.scraper.get_text

    async def counted(url: str) -> str | None:
        attempts.append(clock.now)
        return await real_get(url)

    scaler.scraper.get_text = counted  # type: ignore[method-assign]
    for _ in range(40):  # ten minutes of 15 s intervals
        await scaler.tick()
        clock.now += 15
    assert 7 <= len(attempts) <= 12, attempts  # every interval would be 40
    gaps = [b - a for a, b in itertools.pairwise(attempts)]
    assert gaps[:2] == [15, 15] and max(gaps) <= BACKOFF_CAP_S + 15
    assert scaler.scraper.backoff.failures("pa") == len(attempts)
    async with metrics_server() as address:  # the pod's endpoint answers now
        kube.ip = address
        scaler.views = kube.views
        for _ in range(10):
            await scaler.tick()
            clock.now += 15
    await scaler.close()
    assert scaler.scraper.backoff.failures("pa") == 0
    written = [body["status"]["signals"] for what, body in kube.patches if what == "status"]
    assert written and written[-1]["kvCacheUsage"] == 0.95  # its signals count again
