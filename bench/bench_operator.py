"""Operator at fleet scale, measured against the API server's own limit in the same run.

Starts its own control plane with ``nodes`` KWOK GPU nodes, installs the chart, and measures:

1. raw: the API server alone creating as many ConfigMaps as the burst's services have children,
   each as large as the child it stands for, with the operator's own client (strata.operator.kube)
   and its in-flight limit, before the operator runs; then the children themselves, rendered as
   the operator renders them but owned by nothing (``burst_raw_children_s``): the API server's
   own time for the very objects of the burst, their ReplicaSets and pods included;
2. burst: ``services`` InferenceServices in ``tenants`` namespaces, applied at once: until every
   child exists (a service's router Deployment is applied last and its workload after all but
   the RoleBinding, so a watch on Deployments sees that) and until every service is Ready;
3. steady: services applied at ``rate_per_s`` for ``steady_s``: apply -> all children and
   apply -> Ready, p50 and p99;
4. idle: ``idle_s`` with every service Ready and no traffic.

Reconciles, status refreshes, retries and client-side throttling come from the operator's own
metrics, and so does where a phase's time went (``*_waits``: p50/p99 of the reconcile queue,
the client's in-flight slot, the API server's answer and the operator's event-loop lag); its
requests (watches and Events included) and any 429s from the API server's own counters
(bench.fleet.flow_schema). Readiness is watched by bench.watch: a dropped watch resumes, and a
phase that times out says how many services were Ready by status at that moment.

Heavy: 1,600 services on 100 fake nodes keep a small machine busy for a long while. Run it
alone, in the background (``nice python -m bench operator``); ``STRATA_BENCH_SERVICES=300``
shrinks it (``Scale.sized``)."""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench import fleet
from bench.watch import FirstSeen, ResumableWatch, WatchTimeout, ready
from strata.cluster import Cluster, ClusterConfig, GpuNodeShape, KubectlError, find_bin_dir, launch
from strata.stack import OperatorProcess, install_chart

ISVC_PATH = "/apis/strata.dev/v1alpha1/inferenceservices"
WORKLOAD_PATH = "/apis/apps/v1/deployments"
MANAGED = "app.kubernetes.io/managed-by=strata-operator"
SERVICE_LABEL = "strata.dev/inferenceservice"
DEPLOYMENTS_PER_SERVICE = 2  # the workload and the router's
REQUESTS = "strata_operator_api_requests_total"
WAITS = {  # where the time of a phase went, from the operator's histograms
    "queue": "strata_operator_reconcile_queue_seconds",
    "api_slot": "strata_operator_api_slot_wait_seconds",
    "api_answer": "strata_operator_api_request_duration_seconds",
    "loop_lag": "strata_operator_event_loop_lag_seconds",
}
TARGETS = {  # issue 15's thresholds
    "idle_api_requests_per_service_per_min": 0.5,
    "burst_children_over_raw": 1.5,
    "steady_children_p99_s": 1.0,
    "operator_peak_rss_mb": 200.0,
    "reconciles_per_service": 2.0,
}


@dataclass(frozen=True)
class Scale:
    services: int = 1000  # the burst
    tenants: int = 20
    nodes: int = 100
    gpus_per_node: int = 20  # 2,000 GPUs: room for the burst and the steady services, one each
    rate_per_s: float = 10.0
    steady_s: float = 60.0
    idle_s: float = 300.0
    timeout_s: float = 1800.0  # per wait; a phase that runs out reports how far it got

    @classmethod
    def sized(cls, services: int) -> Scale:
        """A smaller run: as many steady services as burst ones (at most the full minute), and
        nodes for both at one GPU each."""
        rate = cls.rate_per_s
        steady_s = min(cls.steady_s, services / rate)
        gpus = services + int(rate * steady_s)
        return cls(services=services, nodes=max(1, -(-gpus // cls.gpus_per_node)), steady_s=steady_s)

    @classmethod
    def from_env(cls) -> Scale:
        given = os.environ.get("STRATA_BENCH_SERVICES")
        return cls.sized(int(given)) if given else cls()


@dataclass(frozen=True)
class Counters:
    at: float
    reconciles: float
    refreshes: float
    client_requests: float
    retries: float
    throttled: float
    client_429: float
    operator_requests: float  # all of the operator's requests, as the API server counted them
    rejected_429: float
    operator_cpu_s: float
    apiserver_cpu_s: float
    reconcile_s: float  # summed wall time of the reconciles
    write_s: float  # summed latency of the operator's writes (patches), as its client saw them
    writes: float
    status_writes: float  # of those, InferenceService status
    tier_status_writes: float  # and ServiceTier status
    events: float  # Kubernetes Events the operator emitted (kopf posts them, not the client)

    def since(self, before: Counters) -> dict[str, float]:
        now, then = asdict(self), asdict(before)
        return {k: round(now[k] - then[k], 2) for k in now}


class Fleet:
    """The cluster, the operator and the two watches the phases share."""

    def __init__(self, cluster: Cluster, operator: OperatorProcess, scale: Scale) -> None:
        self.cluster, self.operator, self.scale = cluster, operator, scale
        self.ready = FirstSeen(ready)
        self.children = FirstSeen(lambda _: True, key=_every_deployment())
        self.watches = [
            ResumableWatch(cluster, ISVC_PATH, self.ready),
            ResumableWatch(cluster, WORKLOAD_PATH, self.children, selector=MANAGED),
        ]
        self.namespaces = [f"tenant-{i}" for i in range(scale.tenants)]

    def scrape(self) -> str:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{self.operator.metrics_port}/metrics", timeout=30
        ) as r:
            return str(r.read().decode())

    def histograms(self) -> dict[str, dict[float, float]]:
        mine = self.scrape()
        return {k: fleet.buckets(mine, name) for k, name in WAITS.items()}

    def counters(self) -> Counters:
        mine = self.scrape()
        server = fleet.apiserver_metrics(self.cluster)
        assert self.operator.proc is not None
        return Counters(
            at=time.monotonic(),
            reconciles=fleet.samples(mine, "strata_operator_reconciles_total"),
            refreshes=fleet.samples(mine, "strata_operator_status_refreshes_total"),
            client_requests=fleet.samples(mine, REQUESTS),
            retries=fleet.samples(mine, "strata_operator_api_retries_total"),
            throttled=fleet.samples(mine, "strata_operator_api_throttled_total"),
            client_429=fleet.samples(mine, REQUESTS, code="429"),
            operator_requests=fleet.samples(
                server, "apiserver_flowcontrol_dispatched_requests_total", flow_schema=fleet.FLOW_SCHEMA
            ),
            rejected_429=fleet.samples(
                server, "apiserver_flowcontrol_rejected_requests_total", flow_schema=fleet.FLOW_SCHEMA
            ),
            operator_cpu_s=fleet.cpu_seconds(self.operator.proc.pid),
            apiserver_cpu_s=fleet.cpu_seconds(fleet.apiserver_pid(self.cluster)),
            reconcile_s=fleet.samples(mine, "strata_operator_reconcile_duration_seconds_sum"),
            write_s=fleet.samples(mine, "strata_operator_api_request_duration_seconds_sum", verb="patch"),
            writes=fleet.samples(mine, "strata_operator_api_request_duration_seconds_count", verb="patch"),
            status_writes=fleet.samples(mine, REQUESTS, resource="inferenceservices/status"),
            tier_status_writes=fleet.samples(mine, REQUESTS, resource="servicetiers/status"),
            events=fleet.samples(mine, "strata_operator_events_total"),
        )

    def apply(self, prefix: str, count: int, per_s: float | None) -> dict[tuple[str, str], float]:
        """Create ``count`` services round-robin over the tenants; when each was sent."""
        services = [
            fleet.service(self.namespaces[i % len(self.namespaces)], f"{prefix}-{i}") for i in range(count)
        ]
        return asyncio.run(fleet.create_at_rate(self.cluster.kubeconfig, services, per_s))

    def wait(self, seen: FirstSeen, keys: set[tuple[str, str]], what: str) -> dict[tuple[str, str], float]:
        recount = self._count_ready if seen is self.ready else self._count_children
        return seen.wait(keys, self.scale.timeout_s, recount, what)

    def _count_ready(self, keys: set[tuple[str, str]]) -> int:
        listed = self.cluster.kubectl_json("get", "inferenceservices", "-A")["items"]
        return sum(1 for o in listed if ready(o) and _key(o) in keys)

    def _count_children(self, keys: set[tuple[str, str]]) -> int:
        listed = self.cluster.kubectl_json("get", "deployments", "-A", "-l", MANAGED)["items"]
        count = _every_deployment()
        return len({count(o) for o in listed} & keys)


def run(scale: Scale | None = None) -> dict[str, Any]:
    scale = scale or Scale.from_env()
    with tempfile.TemporaryDirectory(prefix="bench-operator-") as tmp:
        shape = GpuNodeShape(gpus=scale.gpus_per_node)
        config = ClusterConfig(gpu_nodes=scale.nodes, node_shape=shape, start_timeout_s=600)
        cluster = launch(Path(tmp) / "cluster", config, bin_dir=find_bin_dir())
        try:
            kubeconfig = install_chart(cluster)
            # no schema validation: a busy API server answers kubectl's schema fetch too late
            cluster.kubectl("apply", "--validate=false", "-f", "-", input=json.dumps(fleet.flow_schema()))
            result: dict[str, Any] = {"scale": asdict(scale)}
            result.update(raw_phase(cluster, scale))
            operator = OperatorProcess(kubeconfig, Path(tmp) / "operator.log").start()
            try:
                measure(Fleet(cluster, operator, scale), result)
            finally:
                operator.stop()
            return finish(result)
        finally:
            cluster.stop()


def raw_phase(cluster: Cluster, scale: Scale) -> dict[str, Any]:
    """The API server alone, before the operator runs, with the operator's client: as many plain
    ConfigMaps as the burst's children, of their sizes (the issue's baseline); then those children
    themselves, as the operator renders them but owned by nothing, so the controllers create
    their ReplicaSets and pods as in the burst. Their namespaces are deleted before the burst."""
    sizes = fleet.child_sizes()
    names = [f"raw-{i}" for i in range(scale.tenants)]
    fleet.create_namespaces(cluster, names)
    manifests = [
        fleet.sized_configmap(names[i % len(names)], f"svc-{i}-{j}", size)
        for i in range(scale.services)
        for j, size in enumerate(sizes)
    ]
    meter = fleet.CpuMeter(fleet.apiserver_pid(cluster))
    seconds = asyncio.run(fleet.create_all(cluster.kubeconfig, manifests))
    raw_cpu = meter.read("raw")
    spaces = [f"raw-children-{i}" for i in range(scale.tenants)]
    fleet.create_namespaces(cluster, spaces)
    children = [
        m for i in range(scale.services) for m in fleet.unowned_children(spaces[i % len(spaces)], f"svc-{i}")
    ]
    meter = fleet.CpuMeter(fleet.apiserver_pid(cluster))
    children_s = asyncio.run(fleet.create_all(cluster.kubeconfig, children))
    raw_cpu |= meter.read("raw_children")
    cluster.kubectl(
        "delete", "namespace", *spaces, f"--timeout={scale.timeout_s:.0f}s", timeout_s=scale.timeout_s + 60
    )
    return {
        "child_sizes_bytes": sizes,
        "raw_objects": len(manifests),
        "burst_raw_create_s": round(seconds, 2),
        "burst_raw_children_s": round(children_s, 2),
        "raw_children_services_per_s": round(scale.services / children_s, 2),
        **raw_cpu,
    }


def measure(f: Fleet, result: dict[str, Any]) -> None:
    """The burst, steady and idle phases into ``result``, each figure as soon as it is measured;
    a phase that times out ends the run with what it saw (``timed_out``), never a hang."""
    fleet.create_namespaces(f.cluster, f.namespaces)
    for watch in f.watches:
        watch.start()
    try:
        start = f.counters()
        burst_phase(f, result)
        steady_phase(f, result)
        result["active"] = f.counters().since(start)
        idle_phase(f, result)
    except WatchTimeout as exc:
        result["timed_out"] = str(exc)
    except KubectlError as exc:  # the API server stopped answering: say so, keep what was measured
        result["timed_out"] = f"the API server did not answer: {exc}"
    finally:
        for watch in f.watches:
            watch.stop()
        result["watch_resumed"] = sum(w.resumed for w in f.watches)
        result["watch_relisted"] = sum(w.relisted for w in f.watches)
        assert f.operator.proc is not None
        result["operator_peak_rss_mb"] = fleet.peak_rss_mb(f.operator.proc.pid)


def burst_phase(f: Fleet, result: dict[str, Any]) -> None:
    before, started = f.histograms(), time.monotonic()
    meter = fleet.CpuMeter(fleet.apiserver_pid(f.cluster))
    sent = f.apply("burst", f.scale.services, per_s=None)
    keys = set(sent)
    result.update(services=len(keys), burst_apply_s=round(time.monotonic() - started, 2))
    children = f.wait(f.children, keys, "services with every child")
    result["burst_all_children_s"] = round(max(children.values()) - started, 2)
    result.update(meter.read("burst"))  # until every child exists, as raw_children
    ready_at = f.wait(f.ready, keys, "services Ready")
    result["burst_all_ready_s"] = round(max(ready_at.values()) - started, 2)
    result["burst_waits"] = waits(before, f.histograms())


def steady_phase(f: Fleet, result: dict[str, Any]) -> None:
    count = int(f.scale.rate_per_s * f.scale.steady_s)
    result.update(steady_services=count, steady_rate_per_s=f.scale.rate_per_s)
    before = f.histograms()
    sent = f.apply("steady", count, per_s=f.scale.rate_per_s)
    children = f.wait(f.children, set(sent), "steady services with every child")
    to_children = sorted(children[k] - sent[k] for k in sent)
    result["steady_children_p50_s"] = round(statistics.median(to_children), 3)
    result["steady_children_p99_s"] = round(_p99(to_children), 3)
    ready_at = f.wait(f.ready, set(sent), "steady services Ready")
    to_ready = sorted(ready_at[k] - sent[k] for k in sent)
    result["steady_ready_p50_s"] = round(statistics.median(to_ready), 3)
    result["steady_ready_p99_s"] = round(_p99(to_ready), 3)
    result["steady_waits"] = waits(before, f.histograms())


def waits(before: dict[str, dict[float, float]], after: dict[str, dict[float, float]]) -> dict[str, Any]:
    """p50 and p99 (bucket upper bounds, seconds) of each of WAITS over a phase."""
    return {
        f"{k}_{q}": fleet.quantile(before[k], after[k], level)
        for k in WAITS
        for q, level in (("p50", 0.5), ("p99", 0.99))
    }


def idle_phase(f: Fleet, result: dict[str, Any]) -> None:
    services = len(f.ready.seen)
    before = f.counters()
    time.sleep(f.scale.idle_s)
    idle = f.counters().since(before)
    minutes = idle["at"] / 60
    result["idle"], result["idle_services"] = idle, services
    result["idle_api_requests_per_service_per_min"] = round(idle["operator_requests"] / services / minutes, 4)


def finish(result: dict[str, Any]) -> dict[str, Any]:
    """Ratios, per-service figures and the issue's thresholds, from the phases' raw numbers."""
    active, total = result.get("active"), result.get("services", 0) + result.get("steady_services", 0)
    if active and total:
        reconciles = max(active["reconciles"], 1)
        result["reconciles_per_service"] = round(active["reconciles"] / total, 2)
        result["status_refreshes_per_service"] = round(active["refreshes"] / total, 2)
        result["api_requests_per_reconcile"] = round(active["operator_requests"] / reconciles, 2)
        result["api_requests_per_service"] = round(active["operator_requests"] / total, 2)
        result["api_requests_per_service_by_kind"] = requests_by_kind(active, total)
        result["client_throttled_requests"] = active["throttled"]
        result["api_retries"] = active["retries"]
        result["server_429s"] = active["rejected_429"]
        result["client_saw_429s"] = active["client_429"]
        result["operator_cpu_s"] = active["operator_cpu_s"]
        result["apiserver_cpu_s"] = active["apiserver_cpu_s"]
        result["reconcile_mean_s"] = round(active["reconcile_s"] / reconciles, 3)
        result["write_mean_s"] = round(active["write_s"] / max(active["writes"], 1), 3)
    if "burst_all_children_s" in result:
        burst = result["burst_all_children_s"]
        result["burst_children_over_raw"] = round(burst / result["burst_raw_create_s"], 2)
        result["burst_children_over_raw_children"] = round(burst / result["burst_raw_children_s"], 2)
    result["targets"] = TARGETS
    result["meets"] = {k: result[k] <= limit for k, limit in TARGETS.items() if k in result}
    result["summary"] = _summary(result)
    return result


def requests_by_kind(active: dict[str, float], services: int) -> dict[str, float]:
    """What the operator's requests per service were: child applies, status writes, Events, and
    the rest (namespace reads, ServiceTier status, watches, retries) as the API server counted."""
    children = active["writes"] - active["status_writes"] - active["tier_status_writes"]
    known = {"children": children, "status": active["status_writes"], "events": active["events"]}
    known["other"] = active["operator_requests"] - sum(known.values())
    return {k: round(v / services, 2) for k, v in known.items()}


def _summary(r: dict[str, Any]) -> str:
    if "timed_out" in r:
        measured = ", ".join(f"{k}={r[k]}" for k in TARGETS if k in r)
        return f"TIMED OUT: {r['timed_out']}; measured before: {measured or 'nothing'}"
    return (
        f"{r['services']} services burst: children {r['burst_all_children_s']}s vs raw "
        f"{r['burst_raw_create_s']}s ({r['burst_children_over_raw']}x), vs the same children without "
        f"operator {r['burst_raw_children_s']}s ({r['burst_children_over_raw_children']}x), Ready "
        f"{r['burst_all_ready_s']}s; "
        f"steady {r['steady_rate_per_s']}/s children p99 {r['steady_children_p99_s']}s, Ready p99 "
        f"{r['steady_ready_p99_s']}s; {r['reconciles_per_service']} reconciles/service; idle "
        f"{r['idle_api_requests_per_service_per_min']} req/service/min; RSS {r['operator_peak_rss_mb']} MB"
    )


def _key(obj: dict[str, Any]) -> tuple[str, str]:
    return (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])


def _every_deployment() -> Callable[[dict[str, Any]], tuple[str, str] | None]:
    """A FirstSeen key: a service's key once both its Deployments have been seen, else None."""
    seen: dict[tuple[str, str], set[str]] = {}

    def key(obj: dict[str, Any]) -> tuple[str, str] | None:
        service = _owning_service(obj)
        if service is None:
            return None
        names = seen.setdefault(service, set())
        names.add(obj["metadata"]["name"])
        return service if len(names) >= DEPLOYMENTS_PER_SERVICE else None

    return key


def _owning_service(obj: dict[str, Any]) -> tuple[str, str] | None:
    meta = obj.get("metadata", {})
    service = (meta.get("labels") or {}).get(SERVICE_LABEL)
    return (meta.get("namespace", ""), service) if service else None


def _p99(ordered: list[float]) -> float:
    return ordered[int(0.99 * (len(ordered) - 1))]
