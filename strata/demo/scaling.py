"""`make demo`'s scaling act: a slice of the shared conversation trace replayed through a
service's router, first at a premium-tier service (which scales up under it and back down after
it), then the same load at a batch-tier service (whose looser targets do not scale it). Both run
the `tiny` model, one thread per worker, as real pods of the local node (the cluster's pod
runtime). A frame a second shows what the operator sees and decides; a table ends the act.

The load is sized to the machine, not guessed (strata.demo.sizing): one replica's throughput is
measured first (a short closed loop through the batch router) and the trace is replayed at a
share of it; premium's targetPrefillUtilization for the demo is set from what the replica then
measurably spends on prompts, so that premium scales up under the load on a quiet machine as on a
loaded one, while batch keeps the chart's targets."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import openai

from strata import stack
from strata.cluster.cluster import Cluster
from strata.common.traces import traces_dir
from strata.demo.platform import UTILIZATION_WINDOW_S
from strata.demo.sizing import HEADROOM, LOAD_SHARE, Measured, Sizing, size
from strata.demo.tally import Tally
from strata.demo.view import LoadView, ServiceReport, ServiceView, frame, table
from strata.loadgen.background import BackgroundLoad
from strata.loadgen.calibrate import compression_for, throughput
from strata.loadgen.summary import Outcome, percentile, summarize
from strata.loadgen.trace import Scaling, TimedRequest, TraceRecord, read_trace, timed_requests
from strata.stack.serving import pod_sample, router_url, worker_pods

NAMESPACE = "tenant-b"
MODEL = "tiny"
MAX_REPLICAS = 2  # two workers and two routers fill a two-core local node
LOAD_S = 60.0  # seconds of trace replayed at each service at least
SERVED_EACH = 30  # premium's load lasts until each of its pods has served this many requests
# Prompts as the trace has them (up to 480 tokens), a few tokens out: the load is prompt
# computation, which is what the tiers' targetPrefillUtilization measures (premium 0.2, batch 0.7).
SHAPE = Scaling(max_output_tokens=4)
CALIBRATE_S = 10.0  # of one replica saturated, to measure its throughput
CALIBRATE_CLIENTS = 4  # enough to saturate a replica; few enough that batch's TTFT stays far under 10 s
PROBE_S = 15.0  # of the load, to measure one replica's prefill utilization under it
TRACE_SLICE = 4000  # records read from the trace; the replay stops after LOAD_S
PREMIUM_CALM_S = 20  # the demo's premium tier scales down after 20 s of calm (the chart's: 300 s)
READY_S = 900.0  # pods import torch: minutes on a loaded two-core machine
SETTLE_S = 900.0  # the scale-down after the load: the utilization window, then the calm window
FRAME_S = 1.0
LOG_FRAME_S = 15.0  # not on a terminal: a frame at least this often
RECENT_S = 10.0  # the clients' TTFT p95 in the live view: the last few seconds


@dataclass(frozen=True)
class Act:
    service: str
    tier: str
    # Read from the tier in the cluster: slo.ttftP95Ms, autoscaling.targetPrefillUtilization and
    # its tolerance.
    target_ms: float = 0.0
    prefill_target: float = 0.0
    tolerance: float = 0.0


@dataclass
class Watched:
    act: Act
    tally: Tally = field(default_factory=Tally)
    load: BackgroundLoad | None = None
    load_started: float | None = None
    outcomes: list[Outcome] = field(default_factory=list)


def run(cluster: Cluster, out: Callable[[str], None] = print) -> list[ServiceReport]:
    """The act, start to end; the closing table's rows. Both services start at once; one is under
    load at a time (the local node has the machine's cores). Both stay, idle, afterwards."""
    premium, batch = (_prepare(cluster, Act("live", "premium")), _prepare(cluster, Act("bulk", "batch")))
    out(
        f"for the demo, premium scales down after {PREMIUM_CALM_S} s of calm (the chart's: 300 s) and the"
        f" operator averages prefill utilization over {UTILIZATION_WINDOW_S} s (its default: 120 s)"
    )
    calm = {"spec": {"autoscaling": {"scaleDownStabilizationSeconds": PREMIUM_CALM_S}}}
    cluster.kubectl("patch", "servicetier", "premium", "--type=merge", "-p", json.dumps(calm))
    cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    with _kwok_cordoned(cluster):  # routers may go anywhere, but nothing serves on a KWOK node
        for act in (premium.act, batch.act):
            cluster.apply(_service(act), NAMESPACE)
        url, batch_url = (_wait_serving(cluster, act, out) for act in (premium.act, batch.act))
        # Measured on batch, which neither the saturating loop nor the probe scales: measured on
        # premium, they would scale it before its own load did.
        requests, sizing = _sized_load(cluster, premium.act, batch.act, batch_url, out)
        target = {"spec": {"autoscaling": {"targetPrefillUtilization": sizing.premium_target}}}
        cluster.kubectl("patch", "servicetier", "premium", "--type=merge", "-p", json.dumps(target))
        watch = Watcher(cluster, [premium], out)
        _replay(watch, premium, url, requests)
        _settle(watch, premium)
        _replay(Watcher(cluster, [batch], out), batch, batch_url, requests)
    reports = [_report(w) for w in (premium, batch)]
    out("\n" + "\n".join(table(reports)))
    return reports


def _replay(watch: Watcher, watched: Watched, url: str, requests: Sequence[TimedRequest]) -> None:
    """LOAD_S of the trace at the service, and, if it scaled up, until each of its pods has
    served SERVED_EACH requests (its own counters say so)."""
    act = watched.act
    watch.out(
        f"\n{act.service} ({act.tier}, TTFT target {act.target_ms:.0f} ms): the trace, {LOAD_S:.0f} s or more"
    )
    _start_load(watched, url, requests)
    watch.until(lambda: _loaded_for(watched, LOAD_S), LOAD_S * 3, f"{act.service}'s load")
    if watched.tally.peak_replicas > 1:
        watch.until(lambda: _spread(watched), READY_S, f"{act.service}'s new pods to serve")
    watched.outcomes = _stop_load(watched)
    watch.poll(force=True)


def _settle(watch: Watcher, watched: Watched) -> None:
    """After the load: back to one replica once the utilization window and the calm have passed."""
    if watched.tally.peak_replicas > 1:
        watch.out(f"{watched.act.service}: load stopped; it scales back down once its window has passed")
        watch.until(lambda: watch.settled(watched), SETTLE_S, f"{watched.act.service} back to one replica")
    watch.poll(force=True)  # the last frame, with the decision that settled it


def _spread(watched: Watched) -> bool:
    """Every pod seen has served SERVED_EACH requests (their own counters): the load spread."""
    served = watched.tally.served().values()
    return len(served) >= watched.tally.peak_replicas and min(served) >= SERVED_EACH


def _prepare(cluster: Cluster, act: Act) -> Watched:
    tier = stack.get(cluster, "servicetier", act.tier)
    if tier is None:
        raise RuntimeError(f"ServiceTier {act.tier} is missing: the chart installs it")
    spec = tier["spec"]
    auto = spec["autoscaling"]
    return Watched(
        replace(
            act,
            target_ms=float(spec["slo"]["ttftP95Ms"]),
            prefill_target=float(auto["targetPrefillUtilization"]),
            tolerance=float(auto["tolerance"]),
        )
    )


@contextlib.contextmanager
def _kwok_cordoned(cluster: Cluster) -> Iterator[None]:
    kwok = cluster.node_names("gpu-node")
    for node in kwok:
        cluster.kubectl("cordon", node)
    try:
        yield
    finally:
        for node in kwok:
            cluster.kubectl("uncordon", node, check=False)


def _wait_serving(cluster: Cluster, act: Act, out: Callable[[str], None]) -> str:
    out(f"waiting for {NAMESPACE}/{act.service} ({act.tier}): a worker pod and a router, real processes")
    stack.wait_ready(cluster, NAMESPACE, act.service, timeout_s=READY_S)
    return stack.wait_for(lambda: _serving_url(cluster, act.service), READY_S, what=f"{act.service} to serve")


def _serving_url(cluster: Cluster, service: str) -> str | None:
    """The router's URL once the service has a pod and its router answers."""
    pods = worker_pods(cluster, NAMESPACE, service)
    return router_url(cluster, NAMESPACE, service) if pods and pod_sample(pods[0]) else None


def _service(act: Act) -> dict[str, Any]:
    return stack.inference_service(
        act.service,
        act.tier,
        resources=stack.local_resources("250m", "1Gi"),
        cache={"dram": "0", "nvme": "0"},  # HBM only: CPU is scarce here
        replicas=1,
        minReplicas=1,
        maxReplicas=MAX_REPLICAS,
    )


def _sized_load(
    cluster: Cluster, premium: Act, batch: Act, url: str, out: Callable[[str], None]
) -> tuple[list[TimedRequest], Sizing]:
    """The trace slice at LOAD_SHARE of one replica's throughput, and premium's target for it
    (strata.demo.sizing), from what batch's one replica (at ``url``) does here and now."""
    path = traces_dir() / "mooncake_conversation.jsonl"
    if not path.exists():
        raise RuntimeError(f"{path} not found (set STRATA_TRACES_DIR to the Mooncake traces)")
    records = read_trace(path, count=TRACE_SLICE)
    shaped = timed_requests(records, SHAPE)
    pod = worker_pods(cluster, NAMESPACE, batch.service)[0]
    rate = asyncio.run(_throughput(url, shaped))
    load = _at_rate(records, shaped, LOAD_SHARE * rate)
    measured = Measured(rate, _utilization_under(pod, url, load))
    sizing = size(measured, batch.prefill_target * (1 + batch.tolerance))
    out(
        f"one replica answers {rate:.1f} requests/s of this trace; at {LOAD_SHARE:.2f} of that "
        f"({sizing.rate_per_s:.1f}/s) it computes prompts {measured.utilization:.3f} of the time (the rest "
        f"of each request is HTTP, the router, tokenising): for the demo premium's targetPrefillUtilization "
        f"is {HEADROOM:g} times under that, {sizing.premium_target:g} (the chart's: "
        f"{premium.prefill_target:g}); batch's stays {batch.prefill_target:g}"
    )
    return load, sizing


def _at_rate(
    records: Sequence[TraceRecord], shaped: Sequence[TimedRequest], rate: float
) -> list[TimedRequest]:
    return timed_requests(records, replace(SHAPE, time_compression=compression_for(shaped, rate)))


def _utilization_under(pod: Mapping[str, Any], url: str, requests: Sequence[TimedRequest]) -> float:
    """The pod's prefill utilization (its own counter) while ``requests`` replay for PROBE_S."""
    before, started = _engine_counter(pod), time.monotonic()
    load = BackgroundLoad(url, MODEL, requests).start()
    try:
        time.sleep(PROBE_S)
        busy = _engine_counter(pod) - before
        return min(1.0, busy / (time.monotonic() - started))
    finally:
        load.stop()


def _engine_counter(pod: Mapping[str, Any]) -> float:
    sample = pod_sample(dict(pod))
    if sample is None:
        raise RuntimeError(f"worker pod {pod['metadata']['name']}: its /metrics did not answer")
    return sample.engine.get("prefill_busy_s", 0.0)


async def _throughput(url: str, requests: Sequence[TimedRequest]) -> float:
    async with openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0, timeout=300) as client:
        return await throughput(client, MODEL, requests, CALIBRATE_CLIENTS, CALIBRATE_S)


def _start_load(watched: Watched, url: str, requests: Sequence[TimedRequest]) -> None:
    watched.load = BackgroundLoad(url, MODEL, requests).start()
    watched.load_started = time.monotonic()


def _loaded_for(watched: Watched, seconds: float) -> bool:
    return watched.load_started is not None and time.monotonic() - watched.load_started >= seconds


def _stop_load(watched: Watched) -> list[Outcome]:
    assert watched.load is not None
    outcomes = watched.load.stop()
    watched.load = None
    return outcomes


def _report(watched: Watched) -> ServiceReport:
    act = watched.act
    return ServiceReport(
        act.service,
        act.tier,
        act.target_ms,
        watched.tally.peak_replicas,
        summarize(watched.outcomes, act.target_ms / 1000),
        watched.tally.hit_ratio(),
    )


class Watcher:
    """Polls the services once a second, keeps the tallies, prints a frame."""

    def __init__(self, cluster: Cluster, watched: Sequence[Watched], out: Callable[[str], None]):
        self.cluster, self.watched, self.out = cluster, watched, out
        self.started = time.monotonic()
        self.services: dict[str, dict[str, Any]] = {}
        self.shown: list[tuple[int | None, int | None, int]] = []
        self.shown_at = 0.0

    def until(self, done: Callable[[], bool], bound_s: float, what: str) -> None:
        deadline = time.monotonic() + bound_s
        while not done():
            if time.monotonic() > deadline:
                raise TimeoutError(f"the scaling act: {what} did not happen within {bound_s:.0f} s")
            tick = time.monotonic()
            self.poll()
            time.sleep(max(0.0, FRAME_S - (time.monotonic() - tick)))

    def settled(self, watched: Watched) -> bool:
        service = self.services.get(watched.act.service) or {}
        one = service.get("spec", {}).get("replicas") == 1
        return one and len(worker_pods(self.cluster, NAMESPACE, watched.act.service)) == 1

    def poll(self, force: bool = False) -> None:
        listed = self.cluster.kubectl_json("get", "inferenceservices,events", "-n", NAMESPACE)["items"]
        self.services = {o["metadata"]["name"]: o for o in listed if o["kind"] == "InferenceService"}
        events = [o for o in listed if o["kind"] == "Event" and o.get("reason") == "Scaled"]
        views = [(self._view(w, events), _load(w)) for w in self.watched]
        lines = [line for view, load in views for line in frame(time.monotonic() - self.started, view, load)]
        if _TERMINAL:
            self.out(_CLEAR + "\n".join(lines))
            return
        # In a log, a frame when a decision or a replica count changes, else every LOG_FRAME_S.
        key = [(v.desired, v.ready, len(v.decisions)) for v, _ in views]
        if force or key != self.shown or time.monotonic() - self.shown_at >= LOG_FRAME_S:
            self.out("\n".join(lines))
            self.shown, self.shown_at = key, time.monotonic()

    def _view(self, watched: Watched, events: Sequence[Mapping[str, Any]]) -> ServiceView:
        act, service = watched.act, self.services.get(watched.act.service) or {}
        for pod in worker_pods(self.cluster, NAMESPACE, act.service):
            sample = pod_sample(pod, timeout_s=2)
            if sample is not None:
                watched.tally.scraped(pod["metadata"]["name"], sample)
        desired = service.get("spec", {}).get("replicas")
        watched.tally.replicas(desired)
        signals = (service.get("status") or {}).get("signals") or {}
        return ServiceView(
            act.service,
            act.tier,
            act.target_ms,
            desired=desired,
            ready=(service.get("status") or {}).get("readyReplicas"),
            kv_usage=signals.get("kvCacheUsage"),
            ttft_p95_ms=signals.get("ttftP95Ms"),
            hit_ratio=signals.get("prefixHitRatio") or {},
            decisions=_decisions(events, act.service),
        )


def _decisions(events: Sequence[Mapping[str, Any]], service: str) -> list[str]:
    mine = [e for e in events if e["involvedObject"]["name"] == service]
    mine.sort(key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
    return [f"{(e.get('lastTimestamp') or '')[11:19]} {e['message']}" for e in mine]


def _load(watched: Watched) -> LoadView:
    outcomes = watched.load.outcomes() if watched.load is not None else watched.outcomes
    if not outcomes:
        return LoadView()
    last = max(o.sent_s for o in outcomes)
    recent = [o.ttft_s for o in outcomes if o.ttft_s is not None and o.sent_s >= last - RECENT_S]
    return LoadView(
        answered=sum(o.error is None for o in outcomes),
        errors=sum(o.error is not None for o in outcomes),
        ttft_p95_s=percentile(recent, 0.95),
    )


# On a terminal each frame replaces the last; in a log (the demo's test) frames follow each other.
_TERMINAL = sys.stdout.isatty()
_CLEAR = "\033[H\033[2J"
