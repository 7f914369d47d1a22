"""End to end with real pods: the chart's operator, two services' workers, the KV-tier sidecar and
the routers all run on the session cluster's local node (the local pod runtime, loopback pod
IPs). The test Prometheus finds them through the chart's monitors; every recording rule and
dashboard query returns data; and the two services' bottleneck verdicts follow from what they
are given, in status and as the operator's metric:

- ``datapath``: a tiny HBM budget and no DRAM tier, so the blocks HBM evicts go to NVMe (the slow
  tier) and come back from there: DataPathBound;
- ``hbm``: the same tiny HBM budget and no lower tier at all: evicted prefixes are recomputed,
  HBM is the limit: HBMBound.

Both take the same load: 16 clients, prompts that share one of 32 prefixes of 250 bytes (more
than 128 KV blocks of 16 tokens hold), 4 tokens each. ``tiny`` model, one torch thread. The load
is a closed loop (each client sends its next request when the last one is answered), so it
holds 16 sequences in flight however fast the machine is: 16 prompts of ~17 blocks each fill
the 128-block budget on a quiet machine as on a busy one; nothing here is sized by a rate."""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import openai
import pytest

from strata.cluster import Cluster
from strata.cluster.nodes import LOCAL_TOLERATION, POD_RUNTIME_LABEL, POD_RUNTIME_LOCAL
from strata.common.endpoints import WORKER_PORT
from strata.observe import dashboard, rules
from strata.observe.prometheus import Prometheus
from strata.stack import (
    free_port,
    get,
    inference_service,
    install_chart,
    items,
    local_resources,
    running_pods,
    wait_for,
    wait_ready,
)
from strata.stack.chart import RELEASE, SYSTEM_NAMESPACE
from strata.stack.wait import WaitTimeout

from .test_dashboard import concrete

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
# Importing torch and loading the model on a loaded two-core machine can take minutes.
READY_S = 900.0
# A verdict is the autoscaler's over one interval (15 s); a few intervals of load decide it.
VERDICT_S = 300.0
# Scrapes every 5 s, rules over 5 m windows: data shows within a minute or two.
DATA_S = 300.0
LOAD_MAX_S = 1800.0  # the load stops by itself after this, whatever happens to the test
CLIENTS, PREFIXES, PREFIX_BYTES, MAX_TOKENS = 16, 32, 250, 4
# 128 blocks of 16 tokens of the tiny model (4 KiB each).
HBM = "512Ki"
# Far more than the 32 prefixes' ~550 blocks; the sidecar allocates its file whole, on this disk.
NVME = "64Mi"
# Ends on a scaling decision only: an annotation, with data within a minute of one.
SCALING_ANNOTATION = dashboard.scaling_annotation().build().expr


@pytest.fixture(scope="module")
def chart_on_local_node(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The chart's operator Deployment running for real on the local node (and the worker pods it
    renders sent there); afterwards the session's own install (no operator pods) again."""
    nvme = tmp_path_factory.mktemp("observe-e2e") / "nvme"
    place = {"tolerations": [LOCAL_TOLERATION], "nodeSelector": {POD_RUNTIME_LABEL: POD_RUNTIME_LOCAL}}
    ports = {"metricsPort": free_port(), "livenessPort": free_port()}  # pods share the host's ports
    values = {
        "operator": {"replicas": 1, **place, **ports},
        "worker": {"tolerations": [LOCAL_TOLERATION], "nvmeVolume": "hostPath", "nvmeHostPath": str(nvme)},
        # The routers too (they take the workers' tolerations): on a KWOK node nothing listens at
        # a router's IP. Four of them at the default 250m would not fit beside the two workers
        # on a two-CPU local node; idle (the load goes to the pods), they need little.
        "router": {
            "nodeSelector": {POD_RUNTIME_LABEL: POD_RUNTIME_LOCAL},
            "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}},
        },
    }
    install_chart(cluster, values=values)
    try:
        cluster.kubectl(
            *(
                "rollout",
                "status",
                f"deployment/{RELEASE}",
                "-n",
                SYSTEM_NAMESPACE,
                f"--timeout={READY_S:.0f}s",
            )
        )
        yield
    finally:
        install_chart(cluster)


def local_service(name: str, dram: str, nvme: str) -> dict[str, Any]:
    resources, cache = local_resources("400m", "2Gi"), {"hbm": HBM, "dram": dram, "nvme": nvme}
    return inference_service(name, "standard", replicas=1, resources=resources, cache=cache)


@dataclass
class Load:
    """Clients sending completions to a pod until stopped (or LOAD_MAX_S); each client picks its
    own random prefix per request, from the service's fixed set."""

    url: str
    stop: threading.Event = field(default_factory=threading.Event)
    prefixes: list[str] = field(default_factory=list)
    done: int = 0
    failed: int = 0

    def __post_init__(self) -> None:
        rng = random.Random(self.url)
        self.prefixes = [
            "".join(rng.choice("abcdefghij ") for _ in range(PREFIX_BYTES)) for _ in range(PREFIXES)
        ]

    def run(self, client_index: int) -> None:
        client = openai.OpenAI(base_url=self.url, api_key="unused", timeout=120, max_retries=0)
        rng = random.Random(f"{self.url}/{client_index}")
        end = time.monotonic() + LOAD_MAX_S
        while not self.stop.is_set() and time.monotonic() < end:
            prompt = f"{rng.choice(self.prefixes)} q{rng.randrange(10**6)}"
            try:
                client.completions.create(model="tiny", prompt=prompt, max_tokens=MAX_TOKENS)
                self.done += 1
            except openai.OpenAIError:
                self.failed += 1
                self.stop.wait(0.5)


@pytest.fixture(scope="module")
def services(cluster: Cluster, chart_on_local_node: None) -> Iterator[str]:
    """The two services, ready and under load; their namespace."""
    namespace = f"observe-e2e-{random.randrange(16**6):06x}"
    cluster.kubectl("create", "namespace", namespace)
    loads: list[Load] = []
    pool = ThreadPoolExecutor(CLIENTS * 2)
    try:
        for name, dram, nvme in (("datapath", "0", NVME), ("hbm", "0", "0")):
            cluster.kubectl(
                "apply", "-n", namespace, "-f", "-", input=json.dumps(local_service(name, dram, nvme))
            )
        for name in ("datapath", "hbm"):
            wait_ready(cluster, namespace, name, timeout_s=READY_S)
            (pod,) = running_pods(cluster, namespace, name)
            loads.append(Load(f"http://{pod['status']['podIP']}:{WORKER_PORT}/v1"))
            for i in range(CLIENTS):
                pool.submit(loads[-1].run, i)
        yield namespace
    finally:
        for load in loads:
            load.stop.set()
        pool.shutdown(wait=True)
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def verdict(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    obj = get(cluster, "inferenceservice", name, namespace) or {}
    return dict((obj.get("status") or {}).get("bottleneck") or {})


@pytest.mark.parametrize(("service", "expected"), [("datapath", "DataPathBound"), ("hbm", "HBMBound")])
def test_the_verdict_follows_the_bottleneck_in_status_and_metrics(
    cluster: Cluster, services: str, prometheus: Prometheus, service: str, expected: str
) -> None:
    seen: list[str] = []

    def reached() -> dict[str, Any] | None:
        now = verdict(cluster, services, service)
        seen.append(f"{now.get('verdict')}: {now.get('reason')}")
        return now if now.get("verdict") == expected else None

    try:
        found = wait_for(reached, VERDICT_S, what=f"{service} {expected}", interval_s=5)
    except WaitTimeout as exc:
        pytest.fail(f"{exc}; the last verdicts: {seen[-5:]}")
    assert found["kvCacheUsage"] is not None and found["engineBusy"] is not None
    if expected == "DataPathBound":
        assert found["tierWaitShare"] >= 0.2, found
    else:
        assert found["hbmEvictionsPerSecond"] + found["preemptionsPerSecond"] > 0, found
    # The operator's metric says so too, as Prometheus scraped it from the operator's pod.
    selector = f'namespace="{services}", service="{service}", verdict="{expected}"'
    expr = f"max_over_time(strata_service_bottleneck{{{selector}}}[5m]) == 1"
    wait_for(lambda: prometheus.query(expr), DATA_S, what=f"Prometheus to have scraped {expr}", interval_s=5)


def test_prometheus_scrapes_operator_workers_sidecars_and_routers(
    cluster: Cluster, services: str, prometheus: Prometheus
) -> None:
    wanted = {
        ("strata-metrics", "operator"),
        (f"{SYSTEM_NAMESPACE}/strata-workers", "engine"),
        (f"{SYSTEM_NAMESPACE}/strata-workers", "kvtier"),
        (f"{SYSTEM_NAMESPACE}/strata-routers", "router"),
    }

    def up() -> set[tuple[str, str]] | None:
        found = {(s["metric"]["job"], s["metric"]["container"]) for s in prometheus.query("up == 1")}
        return found if wanted <= found else None

    try:
        wait_for(up, DATA_S, what=f"targets up for {sorted(wanted)}", interval_s=5)
    except WaitTimeout as exc:
        pytest.fail(
            f"{exc}; the targets: {target_report(prometheus)}; router pods: {router_pods(cluster, services)}"
        )


def target_report(prometheus: Prometheus) -> list[str]:
    """Every active target as job/container pod: health, address and last error."""
    return [
        f"{t['labels'].get('job')}/{t['labels'].get('container')} {t['labels'].get('pod')}: "
        f"{t['health']} {t['scrapeUrl']} {t['lastError']}"
        for t in prometheus.targets()["activeTargets"]
    ]


def router_pods(cluster: Cluster, namespace: str) -> list[str]:
    pods = items(cluster, "pods", namespace, "app.kubernetes.io/component=router")
    return [
        f"{p['metadata']['name']} on {p['spec'].get('nodeName')} at {p['status'].get('podIP')} "
        f"{p['status'].get('phase')}"
        for p in pods
    ]


def test_every_recording_rule_and_dashboard_query_returns_data(services: str, prometheus: Prometheus) -> None:
    recorded = [r["record"] for g in rules.groups() for r in g["rules"] if "record" in r]
    panels = [concrete(e) for e in dashboard.queries() if e != SCALING_ANNOTATION]
    assert len(recorded) >= 20 and len(panels) >= 15

    def empty() -> list[str]:
        return [e for e in [*recorded, *panels] if not prometheus.query(e)]

    missing: list[str] = []

    def all_have_data() -> bool:
        missing[:] = empty()
        return not missing

    try:
        wait_for(all_have_data, DATA_S, what="data for every rule and query", interval_s=5)
    except WaitTimeout as exc:
        pytest.fail(f"{exc}; still without: {missing}")
