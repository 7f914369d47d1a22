"""What the operator benchmark does to a cluster and reads back from it, apart from watching.

Objects are created with the operator's own API client (strata.operator.kube: server-side
apply, the same in-flight limit) as cluster-admin, so the API server's raw rate and the
operator's are measured with the same client. The operator's requests are counted by the API
server itself: a FlowSchema puts the chart's ServiceAccount in a flow of its own, and API
Priority and Fairness counts every request of that flow (watches and Events included)."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from strata.cluster import Cluster
from strata.operator import names
from strata.operator.kube import KubeClient
from strata.operator.plan import OwnerRef
from strata.operator.render.configmap import render_configmap
from strata.operator.render.pdb import render_pdb
from strata.operator.render.priorityclass import render_priorityclass
from strata.operator.render.router import render_router
from strata.operator.render.services import render_client_service, render_metrics_service
from strata.operator.render.workload import render_workload
from strata.operator.resolve import ResolveInput, resolve
from strata.operator.settings import OperatorSettings
from strata.stack import SERVICE_ACCOUNT, SYSTEM_NAMESPACE, inference_service
from strata.stack.chart import CHART

Key = tuple[str, str]
FLOW_SCHEMA = "strata-operator"
TICKS = os.sysconf("SC_CLK_TCK")


def flow_schema() -> dict[str, Any]:
    """Every request of the operator's ServiceAccount in one flow, ahead of the built-in ones."""
    everything = {
        "verbs": ["*"],
        "apiGroups": ["*"],
        "resources": ["*"],
        "clusterScope": True,
        "namespaces": ["*"],
    }
    subject = {
        "kind": "ServiceAccount",
        "serviceAccount": {"name": SERVICE_ACCOUNT, "namespace": SYSTEM_NAMESPACE},
    }
    return {
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
        "kind": "FlowSchema",
        "metadata": {"name": FLOW_SCHEMA},
        "spec": {
            "matchingPrecedence": 500,
            "priorityLevelConfiguration": {"name": "workload-high"},
            "distinguisherMethod": {"type": "ByUser"},
            "rules": [
                {
                    "subjects": [subject],
                    "resourceRules": [everything],
                    "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
                }
            ],
        },
    }


def rendered_children(namespace: str, name: str) -> list[dict[str, Any]]:
    """The children the operator renders for one benchmark service, the router's five included."""
    body = inference_service(name)
    body["metadata"].update(namespace=namespace, uid="0b5e7c1e-1111-4222-8333-444455556666")
    plan = resolve(ResolveInput(body, _tier(), "0b5e7c1e-1111-4222-8333-444455556667"))
    settings = OperatorSettings(nvme_volume="hostPath")
    return [
        render_configmap(plan),
        render_client_service(plan),
        render_metrics_service(plan),
        render_pdb(plan),
        render_workload(plan, settings),
        *render_router(plan, settings),
    ]


def unowned_children(namespace: str, name: str) -> list[dict[str, Any]]:
    """The same children without owner references, for a cluster where no InferenceService owns
    them (the garbage collector would delete children whose owner does not exist)."""
    out = rendered_children(namespace, name)
    for child in out:
        child["metadata"].pop("ownerReferences", None)
    return out


def _tier() -> dict[str, Any]:
    tier: dict[str, Any] = yaml.safe_load((CHART / "files" / "servicetiers" / "standard.yaml").read_text())
    tier["metadata"]["uid"] = "tier-uid"
    return tier


def child_sizes() -> list[int]:
    """Bytes of each child the operator renders for one benchmark service, as JSON (the raw
    phase creates as many objects as the operator does, of these sizes)."""
    return [len(json.dumps(c)) for c in rendered_children("tenant-0", "svc-0")]


def priority_class_json() -> str:
    """The benchmark tier's PriorityClass as the operator renders it, without its owner (for a
    cluster with no operator running)."""
    tier = _tier()
    owner = OwnerRef(names.API_VERSION, names.TIER_KIND, tier["metadata"]["name"], "tier-uid")
    manifest = render_priorityclass(tier["metadata"]["name"], tier["spec"]["priority"], owner)
    manifest["metadata"].pop("ownerReferences")
    return json.dumps(manifest)


def create_namespaces(cluster: Cluster, names_: list[str]) -> None:
    """With the retrying client, not kubectl: a busy API server answers kubectl's schema fetch for
    validation too late (its 32 s timeout), failing the run before it measured anything."""
    manifests = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}} for n in names_]
    asyncio.run(create_all(cluster.kubeconfig, manifests))


def sized_configmap(namespace: str, name: str, size: int) -> dict[str, Any]:
    """A ConfigMap whose JSON is ``size`` bytes long."""
    cm: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace},
        "data": {"pad": ""},
    }
    cm["data"]["pad"] = "x" * max(0, size - len(json.dumps(cm)))
    return cm


async def create_all(kubeconfig: Path, manifests: Iterable[dict[str, Any]]) -> float:
    """Create every manifest as fast as the client's in-flight limit allows; the seconds taken."""
    kube = KubeClient.from_environment(str(kubeconfig))
    started = time.monotonic()
    try:
        await asyncio.gather(*(kube.apply_created(m) for m in manifests))
    finally:
        await kube.close()
    return time.monotonic() - started


async def create_at_rate(
    kubeconfig: Path, manifests: list[dict[str, Any]], per_s: float | None
) -> dict[Key, float]:
    """Send each manifest at its slot (all at once when ``per_s`` is None); when each was sent."""
    kube = KubeClient.from_environment(str(kubeconfig))
    sent: dict[Key, float] = {}
    started = time.monotonic()

    async def one(i: int, manifest: dict[str, Any]) -> None:
        if per_s:
            await asyncio.sleep(max(0.0, started + i / per_s - time.monotonic()))
        meta = manifest["metadata"]
        sent[(meta["namespace"], meta["name"])] = time.monotonic()
        await kube.apply_created(manifest)

    try:
        await asyncio.gather(*(one(i, m) for i, m in enumerate(manifests)))
    finally:
        await kube.close()
    return sent


def service(namespace: str, name: str) -> dict[str, Any]:
    body = inference_service(name)
    body["metadata"]["namespace"] = namespace
    return body


def samples(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` in Prometheus text whose labels include ``labels``."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        head, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


def buckets(text: str, name: str) -> dict[float, float]:
    """A histogram's cumulative bucket counts by upper bound, summed over its label sets."""
    counts: dict[float, float] = {}
    for line in text.splitlines():
        if line.startswith(name + "_bucket{"):
            head, _, value = line.rpartition(" ")
            bound = head.split('le="', 1)[1].split('"', 1)[0]
            le = float("inf") if bound == "+Inf" else float(bound)
            counts[le] = counts.get(le, 0.0) + float(value)
    return counts


def quantile(before: dict[float, float], after: dict[float, float], q: float) -> float | None:
    """The upper bound of the bucket holding quantile ``q`` of what was observed in between
    (None when nothing was)."""
    bounds = sorted(after)
    delta = [after[b] - before.get(b, 0.0) for b in bounds]
    if not delta or delta[-1] <= 0:
        return None
    return next(b for b, n in zip(bounds, delta, strict=True) if n >= q * delta[-1])


def mean_latencies(before: str, after: str) -> dict[str, float]:
    """The API server's mean request duration per ``verb resource`` between two scrapes of its
    /metrics (``apiserver_request_duration_seconds``), for request kinds seen in between."""
    sums, counts = _by_request(before), _by_request(after)
    out = {}
    for key, (total, count) in counts.items():
        was_total, was_count = sums.get(key, (0.0, 0.0))
        if count > was_count:
            out[key] = round((total - was_total) / (count - was_count), 4)
    return dict(sorted(out.items()))


def _by_request(text: str) -> dict[str, tuple[float, float]]:
    found: dict[str, list[float]] = {}
    for line in text.splitlines():
        for suffix, index in (("_sum{", 0), ("_count{", 1)):
            if line.startswith("apiserver_request_duration_seconds" + suffix):
                head, _, value = line.rpartition(" ")
                key = f"{_label(head, 'verb')} {_label(head, 'resource')}"
                if _label(head, "subresource"):
                    key += "/" + _label(head, "subresource")
                found.setdefault(key, [0.0, 0.0])[index] += float(value)
    return {k: (v[0], v[1]) for k, v in found.items()}


def _label(head: str, name: str) -> str:
    for marker in (f'{{{name}="', f',{name}="'):  # "resource" is also the end of "subresource"
        if marker in head:
            return head.split(marker, 1)[1].split('"', 1)[0]
    return ""


def apiserver_metrics(cluster: Cluster) -> str:
    return cluster.kubectl("get", "--raw", "/metrics", timeout_s=300).stdout


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def machine_busy_cpu_s() -> float:
    """CPU-seconds all of this machine's cores spent busy since boot (/proc/stat: everything but
    idle and iowait), to say how busy the machine was during a phase."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / TICKS  # user .. steal, less idle and iowait


class CpuMeter:
    """Where a phase's CPU went: the machine's busy share of all its cores, and the API server's
    CPU-seconds (what it spent on the phase's objects, with whatever else ran)."""

    def __init__(self, apiserver: int) -> None:
        self.apiserver = apiserver
        self.started = (time.monotonic(), machine_busy_cpu_s(), cpu_seconds(apiserver))

    def read(self, prefix: str) -> dict[str, float]:
        at, busy, server = self.started
        core_seconds = max(time.monotonic() - at, 1e-9) * (os.cpu_count() or 1)
        # The kernel counts in ticks (10 ms): over a short phase on a saturated machine the
        # count can run a tick or two past the wall clock; a share is at most the whole machine.
        share = min(1.0, (machine_busy_cpu_s() - busy) / core_seconds)
        return {
            f"{prefix}_machine_busy": round(share, 3),
            f"{prefix}_apiserver_cpu_s": round(cpu_seconds(self.apiserver) - server, 2),
        }


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError(f"no VmHWM in /proc/{pid}/status")


def apiserver_pid(cluster: Cluster) -> int:
    return next(p.pid for p in cluster.owned_processes if p.name == "kube-apiserver")
