"""Waking a service at zero: the decision, and the autoscaler loop reading the held-requests
gauge from a router's real metrics exposition."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiohttp import web

from strata.common.endpoints import ROUTER_PORT
from strata.operator import names
from strata.operator.autoscale import wake
from strata.operator.autoscale.decide import Policy
from strata.operator.autoscale.loop import Autoscaler, Peering
from strata.operator.autoscale.metrics import MetricsError
from strata.operator.events import RecordedEvents
from strata.operator.kube import KubeClient, Obj
from strata.operator.views import IndexViews, PodRef
from strata.router.choose import Prompt
from strata.router.config import RouterConfig
from strata.router.fleet import Fleet
from strata.router.gate import Gate
from strata.router.metrics import RouterMetrics
from tests.operator.pod_ips import serve_as_pod


@pytest.mark.parametrize(
    ("spec", "held", "expected"),
    [
        ({"replicas": 0, "minReplicas": 0, "maxReplicas": 4}, 3, 1),
        ({"replicas": 0, "minReplicas": 0, "maxReplicas": 4}, 0, None),  # nobody waits: stay at zero
        ({"replicas": 2, "minReplicas": 0, "maxReplicas": 4}, 5, None),  # not at zero: the usual loop
    ],
)
def test_a_service_at_zero_wakes_to_one_only_when_requests_are_held(spec, held, expected):
    assert wake.wake_to(spec, held) == expected


def test_a_service_at_zero_holding_more_than_one_replica_takes_wakes_with_the_tiers_step():
    spec = {"replicas": 0, "minReplicas": 0, "maxReplicas": 16, "engine": {"maxNumSeqs": 8}}
    policy = Policy.of({"autoscaling": {"minReplicas": 0, "scaleToZero": True, "maxScaleUpStep": 4}}, spec)
    assert wake.wake_to(spec, 8, policy) == 1  # one replica takes 8 in flight
    assert wake.wake_to(spec, 9, policy) == 5


def test_the_gauge_is_read_from_the_routers_exposition():
    assert wake.held_in("# TYPE strata_router_held_requests gauge\nstrata_router_held_requests 2.0\n") == 2
    assert wake.held_in("strata_router_queued_requests 5\n") == 0
    with pytest.raises(MetricsError):
        wake.held_in("strata_router_held_requests{ 1\n")


class ZeroKube(KubeClient):
    """A service at zero replicas whose one router pod is ready, as the watch caches hold them."""

    def __init__(self, router_ip: str) -> None:
        self.isvc: Obj = {
            "metadata": {"name": "chat", "namespace": "ns", "uid": "u1"},
            "spec": {"tier": "t", "replicas": 0, "minReplicas": 0, "maxReplicas": 3},
        }
        self.patches: list[tuple[str, Any]] = []
        self.views = IndexViews(
            services={("ns", "chat"): [self.isvc]},
            tiers={"t": [{"spec": {}}]},
            pods={("ns", "chat"): [PodRef("r1", "chat-router-x", router_ip, names.ROUTER_APP)]},
        )

    async def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> Obj | None:
        raise AssertionError(f"the autoscaler reads {kind} from the watch cache, not the API server")

    async def request(
        self, method: str, path: str, *, params: Mapping[str, str] | None = None, body: Any = None, **_: Any
    ) -> Obj:
        assert method == "PATCH", f"no reads from the API server: {method} {path}"
        self.patches.append((path.rsplit("/", 1)[1], body))
        return {}


@asynccontextmanager
async def router_metrics(held: int) -> AsyncIterator[str]:
    """A router's own metrics object with ``held`` requests waiting at zero replicas."""
    config = RouterConfig.model_validate({"model": {"name": "m", "max_context_tokens": 64}})
    fleet = Fleet(1, 10)
    gate = Gate(config, fleet, random.Random(0))
    metrics = RouterMetrics(fleet, gate)
    waiting = [asyncio.create_task(gate.enter(Prompt([], 5, 16), 0)) for _ in range(held)]
    await asyncio.sleep(0)

    async def serve(_: web.Request) -> web.Response:
        return web.Response(body=metrics.render())

    app = web.Application()
    app.router.add_get("/metrics", serve)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        yield await serve_as_pod(runner, ROUTER_PORT)  # scraped at its pod IP, as on a cluster
    finally:
        for task in waiting:
            task.cancel()
        await runner.cleanup()


@pytest.mark.parametrize(("held", "woken"), [(2, True), (0, False)])
async def test_the_loop_wakes_a_service_whose_router_holds_requests(held, woken):
    events = RecordedEvents()
    async with router_metrics(held) as router_ip:
        kube = ZeroKube(router_ip)
        scaler = Autoscaler(kube, events, lambda: [("ns", "chat")], Peering(None, 0), views=kube.views)
        try:
            await scaler.tick()
        finally:
            await scaler.close()
    scaled = [body for what, body in kube.patches if what == "scale"]
    if not woken:
        assert scaled == [] and "Scaled" not in events.reasons()
        return
    assert scaled == [{"spec": {"replicas": 1}}]
    status = [body for what, body in kube.patches if what == "status"][-1]["status"]
    assert status["lastScaling"]["fromReplicas"] == 0 and "2 requests held" in status["lastScaling"]["reason"]
    assert "Scaled" in events.reasons()
    assert scaler.histories["u1"].last_traffic is not None  # the idle clock restarted
