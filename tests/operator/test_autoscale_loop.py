"""The autoscaler's glue against an in-memory API and a real HTTP metrics endpoint: priming,
signals in every mode (written only when one moved), scaling only in builtin mode, and a
standby that does nothing. Services, pods and tiers come from the watch caches: the only
requests are writes."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from strata.operator.autoscale.loop import Autoscaler, Peering, signals_changed
from strata.operator.events import RecordedEvents
from strata.operator.kube import KubeClient, Obj
from strata.operator.views import IndexViews, PodRef
from tests.operator.pod_ips import NOBODY, serve_as_pod

EXPOSITION = """\
strata_worker_kv_cache_usage_ratio {kv}
strata_worker_kv_cached_blocks 3
strata_worker_queue_length 1
strata_worker_time_to_first_token_seconds_bucket{{le="1.0"}} 0
strata_worker_time_to_first_token_seconds_bucket{{le="+Inf"}} {count}
strata_worker_time_to_first_token_seconds_count {count}
strata_worker_prompt_tokens_total {prompt}
strata_worker_prefix_hit_tokens_total{{tier="hbm"}} {hits}
"""


class FakeKube(KubeClient):
    def __init__(self, mode: str, peers: Mapping[str, Any] | None = None) -> None:
        self.isvc: Obj = {
            "metadata": {"name": "chat", "namespace": "ns", "uid": "u1"},
            "spec": {
                "tier": "t",
                "replicas": 2,
                "minReplicas": 1,
                "maxReplicas": 6,
                "autoscaling": {"mode": mode},
            },
        }
        # the ready pod's KV usage (0.95) over 0.4 asks for 3 replicas: the pod not ready is not enough
        self.tier: Obj = {"spec": {"autoscaling": {"targetKvCacheUsage": 0.4, "maxScaleUpStep": 1}}}
        self.peers = peers
        self.patches: list[tuple[str, Any]] = []
        self.ip = NOBODY  # the ready pod's IP: where the test's metrics server listens, if it runs

    @property
    def views(self) -> IndexViews:
        """The watch caches, as they hold this fake's objects now."""
        return IndexViews(
            services={("ns", "chat"): [self.isvc]},
            tiers={"t": [self.tier]},
            pods={("ns", "chat"): [PodRef("pa", "a", self.ip)]},  # the ready one of its pods
        )

    async def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> Obj | None:
        raise AssertionError(f"the autoscaler reads {kind} from the watch cache, not the API server")

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> Obj:
        if path.endswith("/pods"):  # only a scale-down lists them, to rank them by cache
            ready = {"podIP": self.ip, "conditions": [{"type": "Ready", "status": "True"}]}
            unready = {"podIP": "127.64.1.3", "conditions": [{"type": "Ready", "status": "False"}]}
            return {
                "items": [
                    {"metadata": {"name": "a", "uid": "pa"}, "status": ready},
                    {"metadata": {"name": "b", "uid": "pb"}, "status": unready},
                ]
            }
        if "clusterkopfpeerings" in path:
            return {"items": [{"status": self.peers}]}
        assert method == "PATCH"
        self.patches.append((path.rsplit("/", 1)[1], body))
        return {}


@asynccontextmanager
async def metrics_server(kv: float = 0.95, extra: str = "") -> AsyncIterator[str]:
    """A worker's /metrics whose counters grow on every scrape, on port 8000 of a loopback address
    of its own (the pod's IP; the autoscaler scrapes pod IPs), in the test's own event loop."""
    scrapes = {"n": 0}

    async def metrics(_: web.Request) -> web.Response:
        scrapes["n"] += 1
        n = scrapes["n"]
        return web.Response(text=EXPOSITION.format(kv=kv, count=10 * n, prompt=100 * n, hits=40 * n) + extra)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    ip = await serve_as_pod(runner)
    try:
        yield ip
    finally:
        await runner.cleanup()


def autoscaler(kube: FakeKube, pod_ip: str, peering: Peering = Peering(None, 0)) -> Autoscaler:
    kube.ip = pod_ip
    return Autoscaler(kube, RecordedEvents(), lambda: [("ns", "chat")], peering, views=kube.views)


async def test_first_interval_primes_then_signals_and_a_builtin_scale() -> None:
    async with metrics_server() as address:
        kube = FakeKube("builtin")
        scaler = autoscaler(kube, address)
        await scaler.tick()
        assert kube.patches == []  # no deltas yet
        await scaler.tick()
        await scaler.close()
        signals = next(
            body for what, body in kube.patches if what == "status" and "signals" in body["status"]
        )
        s = signals["status"]["signals"]
        assert s["kvCacheUsage"] == 0.95 and s["requestsWaiting"] == 1 and s["prefixHitRatio"] == {"hbm": 0.4}
        assert s["ttftP95Ms"] == 1000.0  # every first token in the +Inf bucket: the highest finite bound
        assert ("scale", {"spec": {"replicas": 3}}) in kube.patches
        last = next(
            body for what, body in kube.patches if what == "status" and "lastScaling" in body["status"]
        )
        assert (
            last["status"]["lastScaling"]["fromReplicas"] == 2
            and last["status"]["lastScaling"]["toReplicas"] == 3
        )
        assert isinstance(scaler.events, RecordedEvents)
        assert scaler.events.reasons() == ["Scaled"]
        assert scaler.events.events[0][3].endswith("kvCacheUsage 0.95 > target 0.40: 2 -> 3")


async def test_mode_off_reports_signals_once_while_they_hold_and_never_scales() -> None:
    async with metrics_server() as address:
        kube = FakeKube("off")
        scaler = autoscaler(kube, address)
        for _ in range(4):
            await scaler.tick()
        await scaler.close()
        # Every interval after priming sees the same rates: one write, then nothing moved.
        assert [what for what, _ in kube.patches] == ["status"]
        assert "signals" in kube.patches[0][1]["status"]


async def test_the_workers_kv_size_reaches_status_once_and_the_owner_is_told() -> None:
    async with metrics_server(extra="strata_worker_kv_bytes_per_token 12288\n") as address:
        kube = FakeKube("off")
        scaler = autoscaler(kube, address)
        for _ in range(3):
            await scaler.tick()
        kube.isvc["spec"]["model"] = {"kvBytesPerToken": 12288}  # the owner set it
        await scaler.tick()
        kube.isvc["spec"]["model"] = {"kvBytesPerToken": 57344}  # and later set it wrong
        await scaler.tick()
        await scaler.close()
    models = [body["status"]["model"] for what, body in kube.patches if "model" in body["status"]]
    assert [m["kvBytesPerToken"] for m in models] == [12288]  # from the first scrape, written once
    assert isinstance(scaler.events, RecordedEvents)
    assert scaler.events.reasons() == ["KVBytesPerTokenUnset", "KVBytesPerTokenDiffers"]


async def test_an_unreachable_worker_writes_nothing_and_leaves_replicas_alone() -> None:
    kube = FakeKube("builtin")
    scaler = autoscaler(kube, NOBODY)  # nothing listens there: connection refused
    await scaler.tick()
    await scaler.tick()
    await scaler.close()
    assert kube.patches == []  # unknown signals are absent signals: no news, no write


def test_a_signal_moved_is_a_change_and_a_new_scrape_time_is_not() -> None:
    before = {"kvCacheUsage": 0.5, "ttftP95Ms": None, "observedAt": "2026-01-01T00:00:00Z"}
    assert not signals_changed(before, {**before, "observedAt": "2026-01-01T00:05:00Z"})
    assert not signals_changed(None, {"kvCacheUsage": None, "observedAt": "2026-01-01T00:05:00Z"})
    assert signals_changed(before, {**before, "kvCacheUsage": 0.6})
    assert signals_changed(before, {**before, "kvCacheUsage": None})


async def test_a_standby_replica_neither_scrapes_nor_remembers() -> None:
    async with metrics_server() as address:
        now = datetime.now(UTC).isoformat()
        peers = {
            "me": {"priority": 1, "lastseen": now, "lifetime": 60},
            "x": {"priority": 9, "lastseen": now},
        }
        kube = FakeKube("builtin", peers)
        scaler = autoscaler(kube, address, Peering("strata", 1))
        await scaler.tick()
        await scaler.tick()
        await scaler.close()
        assert kube.patches == [] and scaler.scrapes == {}


async def test_a_scale_down_ranks_the_pods_by_cache_before_lowering_replicas() -> None:
    async with metrics_server(kv=0.05) as address:
        kube = FakeKube("builtin")
        kube.tier = {
            "spec": {
                "autoscaling": {"targetKvCacheUsage": 0.5, "scaleDownStabilizationSeconds": 0},
                "slo": {"ttftP95Ms": 100_000},
            }
        }
        scaler = autoscaler(kube, address)
        await scaler.tick()
        await scaler.tick()
        await scaler.close()
        order = [what for what, _ in kube.patches if what != "status"]
        assert order == ["a", "scale"]  # the ready pod's cost first, then the replica count
        annotations = kube.patches[[w for w, _ in kube.patches].index("a")][1]["metadata"]["annotations"]
        # 40 HBM hit tokens in the interval + 3 cached blocks x 16 tokens
        assert annotations == {"controller.kubernetes.io/pod-deletion-cost": "88"}
        assert isinstance(scaler.events, RecordedEvents)
        assert scaler.events.reasons() == ["ScaleInOrder", "Scaled"]
        assert scaler.events.events[0][3].startswith("coldest first: a goes first")


async def test_a_scale_decided_once_is_not_decided_again_while_the_watch_cache_lags() -> None:
    async with metrics_server(kv=0.05) as address:
        kube = FakeKube("builtin")
        kube.isvc["metadata"]["resourceVersion"] = "7"
        kube.tier = {
            "spec": {
                "autoscaling": {"targetKvCacheUsage": 0.5, "scaleDownStabilizationSeconds": 0},
                "slo": {"ttftP95Ms": 100_000},
            }
        }
        scaler = autoscaler(kube, address)
        for _ in range(3):  # the cache still says 2 replicas at version 7 on the third interval
            await scaler.tick()
        assert isinstance(scaler.events, RecordedEvents)
        assert scaler.events.reasons() == ["ScaleInOrder", "Scaled"]
        # a newer version is the truth again: someone set 4, and 4 -> 1 is decided
        kube.isvc["metadata"]["resourceVersion"] = "9"
        kube.isvc["spec"]["replicas"] = 4
        scaler.views = kube.views
        await scaler.tick()
        await scaler.close()
        assert scaler.events.reasons() == ["ScaleInOrder", "Scaled", "ScaleInOrder", "Scaled"]
        assert "4 -> " in scaler.events.events[-1][3]
