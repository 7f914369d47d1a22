"""The autoscaler's interval also diagnoses and accounts: status.bottleneck, the operator's
per-service metrics (active replica only), and each ServiceTier's status.usage."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest

from strata.operator.autoscale.loop import Autoscaler, Peering
from strata.operator.events import RecordedEvents
from strata.operator.kube import KubeClient, KubeError, Obj
from strata.operator.views import IndexViews, PodRef
from strata.stack.manifests import inference_service
from tests.operator.pod_ips import NOBODY, serve_as_pod

ROOT = Path(__file__).resolve().parents[2]
# One pod: busy 9 s of every 10 s interval, 1 s of it waiting on the tiers, KV 40 % used.
EXPOSITION = """\
strata_worker_kv_cache_usage_ratio 0.4
strata_worker_time_to_first_token_seconds_bucket{{le="+Inf"}} {n}
strata_worker_time_to_first_token_seconds_count {n}
strata_worker_prompt_tokens_total {prompt}
strata_worker_engine_busy_seconds_total {busy}
strata_worker_tier_wait_seconds_total{{op="load"}} {wait}
strata_worker_preemptions_total 0
strata_worker_hbm_evictions_total 0
"""


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeKube(KubeClient):
    """A service that resolves in the real standard tier, one ready pod; patches kept by path."""

    def __init__(self) -> None:
        self.isvc: Obj = inference_service(
            "chat", resources={"gpus": 2}, cache={"dram": "4Gi"}, autoscaling={"mode": "off"}
        )
        self.isvc["metadata"].update(namespace="team-a", uid="u1")
        self.isvc["status"] = {"replicas": 1, "readyReplicas": 1, "desiredReplicas": 1}
        self.tier: Obj = yaml.safe_load((ROOT / "examples" / "servicetiers" / "standard.yaml").read_text())
        self.tier["metadata"]["resourceVersion"] = "7"
        self.patches: list[tuple[str, Any]] = []
        self.conflicts = 0  # how many tier status patches to refuse with 409 Conflict
        self.ip = NOBODY  # the pod's IP, where the test's worker serves its metrics

    @property
    def views(self) -> IndexViews:
        key = ("team-a", "chat")
        return IndexViews(
            services={key: [self.isvc]},
            tiers={"standard": [self.tier]},
            pods={key: [PodRef("p0", "chat-0", self.ip)]},
        )

    async def request(self, method: str, path: str, **kwargs: Any) -> Obj:
        if path.endswith("servicetiers/standard/status") and self.conflicts:
            self.conflicts -= 1
            raise KubeError(409, "Conflict", "the object has been modified")
        self.patches.append((path, kwargs.get("body")))
        return {}


@asynccontextmanager
async def worker(clock: Clock) -> AsyncIterator[str]:
    async def metrics(_: web.Request) -> web.Response:
        t = clock.now - 1000.0
        text = EXPOSITION.format(n=t, prompt=10 * t, busy=0.9 * t, wait=0.1 * t)
        return web.Response(text=text)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        yield await serve_as_pod(runner)
    finally:
        await runner.cleanup()


async def two_intervals(kube: FakeKube | None = None) -> tuple[FakeKube, Autoscaler]:
    clock, kube = Clock(), kube or FakeKube()
    async with worker(clock) as pod_ip:
        kube.ip = pod_ip
        scaler = Autoscaler(
            kube,
            RecordedEvents(),
            lambda: [("team-a", "chat")],
            Peering(None, 0),
            views=kube.views,
            clock=clock,
        )
        scaler.accounting.usage_write_interval_s = 5.0
        await scaler.tick()
        clock.now += 10.0
        await scaler.tick()
        await scaler.close()
    return kube, scaler


async def test_status_bottleneck_says_compute_bound_with_its_numbers() -> None:
    kube, _ = await two_intervals()
    status = next(b["status"] for p, b in kube.patches if p.endswith("inferenceservices/chat/status"))
    b = status["bottleneck"]
    assert b["verdict"] == "ComputeBound" and b["engineBusy"] == 0.9
    assert b["tierWaitShare"] == 0.1111 and b["kvCacheUsage"] == 0.4
    assert "engine busy 90%" in b["reason"]


async def test_metrics_carry_verdict_replicas_and_cost_per_service() -> None:
    _, scaler = await two_intervals()
    registry = CollectorRegistry()
    registry.register(scaler.telemetry)
    text = generate_latest(registry).decode()
    labels = 'namespace="team-a",service="chat",service_tier="standard"'
    assert f'strata_service_bottleneck{{{labels},verdict="ComputeBound"}} 1.0' in text
    assert f'strata_service_bottleneck{{{labels},verdict="Idle"}} 0.0' in text
    assert f"strata_service_ready_replicas{{{labels}}} 1.0" in text
    assert f"strata_cost_gpu_seconds_total{{{labels}}} 20.0" in text  # 1 replica x 2 GPUs x 10 s
    dram = 1 * 4 * 10 / 3600
    assert f'strata_cost_cache_gib_hours_total{{{labels},tier="dram"}} {dram!r}' in text
    scaler.telemetry.deactivate()  # a standby exports nothing per service
    assert "strata_service_bottleneck{" not in generate_latest(registry).decode()


async def test_the_tiers_status_usage_accumulates_per_namespace() -> None:
    kube, scaler = await two_intervals()
    (usage,) = [b["status"]["usage"] for p, b in kube.patches if p.endswith("servicetiers/standard/status")]
    assert usage["gpuSeconds"] == 20.0
    assert usage["namespaces"] == [
        {
            "namespace": "team-a",
            "gpuSeconds": 20.0,
            "cacheGiBHours": {"dram": 0.0111, "nvme": usage["cacheGiBHours"]["nvme"], "shared": 0.0},
        }
    ]
    assert scaler.telemetry.unwritten == {}


def tier_patches(kube: FakeKube) -> list[Any]:
    return [b for p, b in kube.patches if p.endswith("servicetiers/standard/status")]


async def test_usage_is_added_to_what_another_release_wrote_under_its_resource_version() -> None:
    """Two releases (disjoint watchNamespaces) share the cluster-scoped tier: each adds its own
    namespaces' cost to the tier as it is, and only if nobody wrote in between."""
    kube = FakeKube()
    theirs = {
        "namespace": "team-b",
        "gpuSeconds": 100.0,
        "cacheGiBHours": {"dram": 1.0, "nvme": 0.0, "shared": 0.0},
    }
    kube.tier["status"] = {
        "usage": {"since": "2026-11-30T00:00:00Z", "gpuSeconds": 100.0, "namespaces": [theirs]}
    }
    kube, _ = await two_intervals(kube)
    (body,) = tier_patches(kube)
    assert body["metadata"] == {"resourceVersion": "7"}
    usage = body["status"]["usage"]
    assert usage["gpuSeconds"] == 120.0 and usage["since"] == "2026-11-30T00:00:00Z"
    assert [n["namespace"] for n in usage["namespaces"]] == ["team-a", "team-b"]
    assert usage["namespaces"][1] == theirs


async def test_a_tier_changed_since_the_cache_keeps_its_usage_for_the_next_write() -> None:
    kube = FakeKube()
    kube.conflicts = 1
    kube, scaler = await two_intervals(kube)
    assert tier_patches(kube) == []
    assert scaler.telemetry.unwritten["standard"]["team-a"].gpu_seconds == 20.0
