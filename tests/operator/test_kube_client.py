"""The operator's API client against a real HTTP server on loopback: a busy API server's slow
answers, 429s and dropped connections are retried with back-off, not reported as failures."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web
from kubernetes import client as k8s_client

from strata.operator.backoff import AdaptiveLimit, Backoff, LatencyTimeout, retry_after_s
from strata.operator.kube import ClientPolicy, KubeClient, KubeError, describe
from strata.operator.metrics import OperatorMetrics

PATH = "/api/v1/namespaces/team-a"
FAST = Backoff(first_s=0.01, max_s=0.05, attempts=4)

Answer = Callable[[int], Awaitable[web.StreamResponse]]
Serve = Callable[[Answer], Awaitable[str]]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """Start an HTTP server on loopback whose n-th request gets ``answer(n)``; its base URL."""
    runners: list[web.AppRunner] = []

    async def start(answer: Answer) -> str:
        calls = {"n": 0}

        async def handle(_: web.Request) -> web.StreamResponse:
            calls["n"] += 1
            return await answer(calls["n"])

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handle)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return f"http://127.0.0.1:{port}"

    yield start
    for runner in runners:
        await runner.cleanup()


def client(host: str, floor_s: float = 5.0) -> tuple[KubeClient, OperatorMetrics]:
    cfg = k8s_client.Configuration()
    cfg.host, cfg.verify_ssl = host, False
    kube = KubeClient(
        cfg, policy=ClientPolicy(timeout_floor_s=floor_s, timeout_ceiling_s=floor_s, retries=FAST)
    )
    metrics = OperatorMetrics()
    kube.observer = metrics
    return kube, metrics


def sample(metrics: OperatorMetrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


async def test_429_and_503_are_retried_until_an_answer(serve: Serve) -> None:
    async def answer(n: int) -> web.StreamResponse:
        if n == 1:
            return web.json_response({"reason": "TooManyRequests"}, status=429, headers={"Retry-After": "0"})
        if n == 2:
            return web.json_response({"reason": "ServiceUnavailable"}, status=503)
        return web.json_response({"metadata": {"name": "team-a"}})

    kube, metrics = client(await serve(answer))
    assert (await kube.request("GET", PATH))["metadata"]["name"] == "team-a"
    assert sample(metrics, "strata_operator_api_retries_total", reason="throttled") == 1
    assert sample(metrics, "strata_operator_api_retries_total", reason="server") == 1
    assert kube.flow.limit < kube.policy.max_in_flight  # an overloaded server gets fewer at once
    assert (
        sample(metrics, "strata_operator_api_requests_total", verb="get", resource="namespaces", code="200")
        == 1
    )
    await kube.close()


async def test_a_stalled_answer_times_out_and_the_retry_gets_through(serve: Serve) -> None:
    async def answer(n: int) -> web.StreamResponse:
        if n == 1:
            await asyncio.sleep(10)  # five times the timeout: the client gives up on it
        return web.json_response({"metadata": {"name": "team-a"}})

    # A 2 s timeout: short enough for a quick test, long enough that the retry's prompt answer is not
    # itself timed out on a slow, loaded machine (0.3 s was, under a load average of 25).
    kube, metrics = client(await serve(answer), floor_s=2.0)
    assert (await kube.request("GET", PATH))["metadata"]["name"] == "team-a"
    assert sample(metrics, "strata_operator_api_retries_total", reason="timeout") == 1
    await kube.close()


async def test_an_answer_is_not_retried_and_spent_retries_raise_the_last_error(serve: Serve) -> None:
    async def not_found(n: int) -> web.StreamResponse:
        return web.json_response({"reason": "NotFound", "message": "gone"}, status=404)

    kube, metrics = client(await serve(not_found))
    assert await kube.get("v1", "Namespace", "team-a") is None
    assert sample(metrics, "strata_operator_api_retries_total", reason="server") == 0
    await kube.close()  # before the fixture's server cleanup, which would otherwise close its connection

    async def always_busy(n: int) -> web.StreamResponse:
        return web.json_response({"reason": "ServiceUnavailable", "message": "busy"}, status=503)

    kube, metrics = client(await serve(always_busy))
    with pytest.raises(KubeError, match="503 ServiceUnavailable: busy"):
        await kube.request("GET", PATH)
    assert sample(metrics, "strata_operator_api_retries_total", reason="server") == FAST.attempts - 1
    await kube.close()


def test_timeouts_follow_recent_latency_between_floor_and_ceiling() -> None:
    timeout = LatencyTimeout(floor_s=10, ceiling_s=120, factor=4)
    assert timeout.current() == 10
    for _ in range(100):
        timeout.observe(0.05)
    assert timeout.current() == 10  # a fast server: the floor
    for _ in range(100):
        timeout.observe(8.0)
    assert timeout.current() == 32  # a slow one: 4 x its 95th percentile
    for _ in range(256):
        timeout.observe(60.0)
    assert timeout.current() == 120


def test_a_retry_waits_twice_as_long_and_timeouts_count_as_latency() -> None:
    timeout = LatencyTimeout(floor_s=2, ceiling_s=120, factor=4)
    assert [timeout.for_attempt(a) for a in range(4)] == [2, 4, 8, 16]
    timeout.observe(2.0)  # the first request timed out at 2 s: nothing answered faster yet
    assert timeout.current() == 8 and timeout.for_attempt(6) == 120


def test_retry_after_is_read_in_seconds_and_capped() -> None:
    assert retry_after_s("3", cap_s=8) == 3 and retry_after_s("30", cap_s=8) == 8
    assert retry_after_s(None, cap_s=8) == 0 and retry_after_s("Wed, 21 Oct 2015 07:28:00 GMT", 8) == 0


@pytest.mark.parametrize(
    ("method", "path", "expected"),
    [
        ("GET", "/api/v1/namespaces/ns/pods", ("list", "pods")),
        ("GET", "/api/v1/namespaces/ns", ("get", "namespaces")),
        ("PATCH", "/apis/strata.dev/v1alpha1/namespaces/ns/inferenceservices/chat/status",
         ("patch", "inferenceservices/status")),
        ("DELETE", "/apis/scheduling.k8s.io/v1/priorityclasses/strata", ("delete", "priorityclasses")),
        ("GET", "/apis/kopf.dev/v1/clusterkopfpeerings", ("list", "clusterkopfpeerings")),
    ],
)  # fmt: skip
def test_requests_are_named_as_the_api_server_names_them(method: str, path: str, expected) -> None:
    assert describe(method, path) == expected


def test_in_flight_limit_halves_on_overload_once_per_cooldown_and_grows_back_by_one() -> None:
    flow = AdaptiveLimit(ceiling=32, cooldown_s=1.0)
    flow.overloaded(now=10.0)
    flow.overloaded(now=10.5)  # the same overload failing many requests: one cut
    assert flow.limit == 16
    flow.overloaded(now=11.0)
    assert flow.limit == 8
    for _ in range(9):
        flow.answered()
    assert flow.limit == 9  # one more after about as many answers as the limit
    for _ in range(10_000):
        flow.answered()
    assert flow.limit == 32
    for i in range(20):
        flow.overloaded(now=100.0 + 2 * i)
    assert flow.limit == 1
