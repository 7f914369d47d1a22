"""The loop the project exists for, end to end on the test control plane with real worker pods
(`tiny` model, one thread each, run by the local pod runtime) behind the real routers:

- load through the router pushes a fast tier's TTFT p95 over its target: the autoscaler scales
  the service up; the new pod serves requests (its own metrics say so); the load stops: after the
  stabilisation window the service scales down, and the pod removed first is the one with the
  least cache value;
- the same load on a loose tier does not scale it; idle, it goes to zero, and a request through
  its router wakes it and completes;
- a pod deleted under load stops taking requests, finishes what it had, logs it, and no client
  sees an error.

The load is sized to this machine, not guessed: one replica's throughput on the trace slice is
measured first through the router (a short closed loop), and the slice is replayed at
``LOAD_SHARE`` of it, to each service at once. That keeps a replica computing prompts well over
the fast tier's 1 % target whether the machine is quiet or busy, and far from the loose tier's
30 s TTFT target. Two such loads, two routers each and a pod starting share two cores, so a
replica does less than it did alone: at half of it each (the first sizing) a fresh clone on a
quiet machine saw fast's queue predicted at 120 s while its new pod started, and its router
refused requests with 429 past the standard tier's 30 s queue TTL. The tests' tiers wait up to
``QUEUE_TTL_S`` instead: what is tested is the scaling, not the router's load shedding. The
tests' own ServiceTiers set the targets and windows and the operator decides every 2 s. Every
wait is on an event (a status field, an Event, a pod going) with a generous bound."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml

from strata.cluster import Cluster
from strata.common.endpoints import WORKER_PORT
from strata.common.traces import traces_dir
from strata.loadgen.background import BackgroundLoad
from strata.loadgen.calibrate import compression_for, throughput
from strata.loadgen.summary import Outcome
from strata.loadgen.trace import Scaling, TimedRequest, read_trace, timed_requests
from strata.stack import (
    OperatorProcess,
    events,
    get,
    inference_service,
    local_pods_env,
    local_resources,
    operator_running,
    wait_for,
    wait_ready,
)
from strata.stack.serving import loopback_ip, pod_sample, router_url, worker_pods

# Pods start in minutes on a loaded machine, and each test waits on several of them: the bounds
# are the waits' own (READY_S, SETTLE_S), not the suite's per-test 900 s.
pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(3600)]
CHART_TIERS = Path(__file__).resolve().parents[2] / "charts" / "strata" / "files" / "servicetiers"
CONVERSATION = traces_dir() / "mooncake_conversation.jsonl"
READY_S = 900.0  # a worker pod imports torch and loads its model: minutes on a loaded two-core machine
SETTLE_S = 300.0  # a decision, a Deployment's reaction, a pod's drain
FAST, LOOSE = "e2e-fast", "e2e-loose"
FAST_TARGET_MS, LOOSE_TARGET_MS = 50, 30_000
FAST_UTILIZATION = 0.01
LOAD_SHARE = 0.35  # of one replica's measured throughput, to each service: busy, not a queue without bound
QUEUE_TTL_S = 300  # the clients' own timeout
SHAPE = Scaling(block_tokens=16, max_prompt_tokens=128, max_output_tokens=4)  # prompts, a few tokens out
# The scale-up's reason: a queue behind a 50 ms target, or prompts keeping a pod busy 1 % of the time.
FAST_OVER = (
    rf"TTFT p95 \d+ ms > target {FAST_TARGET_MS} ms|prefillUtilization [\d.]+ > target {FAST_UTILIZATION}"
)
IDLE_30_S = json.dumps({"spec": {"autoscaling": {"scaleToZeroIdleSeconds": 30}}})


def tier(name: str, ttft_ms: int, **autoscaling: Any) -> dict[str, Any]:
    """The chart's standard tier renamed, with its TTFT target and autoscaling fields replaced.
    Its pods get priority 0, the routers' own: on the two-core local node a worker pod that does
    not fit waits for room instead of preempting a router that clients are talking to."""
    manifest: dict[str, Any] = yaml.safe_load((CHART_TIERS / "standard.yaml").read_text())
    manifest["metadata"] = {"name": name}
    manifest["spec"]["priority"] = 0
    manifest["spec"]["slo"]["ttftP95Ms"] = ttft_ms
    manifest["spec"]["routing"] = {"queueTtlSeconds": QUEUE_TTL_S}
    manifest["spec"]["autoscaling"].update(autoscaling)
    return manifest


def service(name: str, tier_name: str, **spec: Any) -> dict[str, Any]:
    """The `tiny` model on the local node's CPU, HBM cache only (no sidecar: CPU is scarce). It
    requests 100m so that three workers and four routers (250m each) fit the local node, which
    offers the machine's cores; a worker's one thread uses what it gets."""
    resources = local_resources("100m", "1Gi")
    return inference_service(name, tier_name, resources=resources, cache={"dram": "0", "nvme": "0"}, **spec)


@pytest.fixture(scope="module")
def operator(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    directory = tmp_path_factory.mktemp("closed-loop")
    env = {**local_pods_env(directory / "nvme"), "STRATA_AUTOSCALE_INTERVAL_S": "2"}
    tiers = [
        tier(FAST, FAST_TARGET_MS, targetPrefillUtilization=FAST_UTILIZATION, targetKvCacheUsage=1.0,
             scaleUpStabilizationSeconds=0, scaleDownStabilizationSeconds=20, maxScaleUpStep=1,
             maxScaleDownStep=1),
        tier(LOOSE, LOOSE_TARGET_MS, targetPrefillUtilization=1.0, targetKvCacheUsage=1.0,
             scaleUpStabilizationSeconds=0, scaleDownStabilizationSeconds=20, minReplicas=0,
             scaleToZero=True, scaleToZeroIdleSeconds=3600),
    ]  # fmt: skip
    kwok = cluster.node_names("gpu-node")
    try:
        with operator_running(cluster, directory / "operator.log", env=env) as process:
            for manifest in tiers:  # once the chart has installed the CRDs
                cluster.apply(manifest)
            for node in kwok:  # routers run anywhere, but nothing serves on a KWOK node: keep them off
                cluster.kubectl("cordon", node)
            yield process
    finally:
        for manifest in tiers:
            cluster.kubectl("delete", "servicetier", manifest["metadata"]["name"], "--ignore-not-found")
        for node in kwok:
            cluster.kubectl("uncordon", node)


def sized_load(url: str, count: int = 3000) -> list[TimedRequest]:
    """A slice of the conversation trace (short prompts that share prefixes where the trace's
    conversations do, a few tokens out) at ``LOAD_SHARE`` of the throughput the service behind
    ``url`` measures on it now."""
    records = read_trace(CONVERSATION, count=count)
    shaped = timed_requests(records, SHAPE)
    measured = asyncio.run(_throughput(url, shaped))
    assert measured > 0, f"{url}: the service completed no request in the throughput measurement"
    compression = compression_for(shaped, LOAD_SHARE * measured)
    return timed_requests(records, dataclasses.replace(SHAPE, time_compression=compression))


async def _throughput(url: str, requests: list[TimedRequest]) -> float:
    async with openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0, timeout=300) as client:
        return await throughput(client, "tiny", requests)


def ready_service(cluster: Cluster, namespace: str, name: str) -> str:
    """Wait until the service is ready, with a worker pod that answers and a router; its URL."""
    wait_ready(cluster, namespace, name, timeout_s=READY_S)

    def serving() -> str | None:
        pods = worker_pods(cluster, namespace, name)
        return router_url(cluster, namespace, name) if pods and pod_sample(pods[0]) else None

    return wait_for(serving, READY_S, what=f"{name}'s worker and router to answer")


def scaled(cluster: Cluster, namespace: str, name: str, pattern: str) -> list[str]:
    """The messages of the service's Scaled Events matching ``pattern``."""
    found = [e["message"] for e in events(cluster, namespace, name) if e["reason"] == "Scaled"]
    return [m for m in found if re.search(pattern, m)]


def errors(outcomes: list[Outcome]) -> list[str]:
    return [o.error for o in outcomes if o.error is not None]


def test_load_scales_up_then_down_coldest_first_and_a_loose_tier_neither_until_idle(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    if not CONVERSATION.exists():
        pytest.skip(f"{CONVERSATION} not present (set STRATA_TRACES_DIR)")
    cluster.apply(service("fast", FAST, replicas=1, minReplicas=1, maxReplicas=2), namespace)
    cluster.apply(service("loose", LOOSE, replicas=1, minReplicas=0, maxReplicas=2), namespace)
    fast_url, loose_url = (
        ready_service(cluster, namespace, "fast"),
        ready_service(cluster, namespace, "loose"),
    )
    (first,) = worker_pods(cluster, namespace, "fast")
    _kv_size_reported(cluster, namespace, first)
    # Measured on loose, whose targets a closed loop does not exceed: measured on fast, the
    # measurement itself would scale it. The two replicas are alike: the same load for both.
    requests = sized_load(loose_url)
    fast_load = BackgroundLoad(fast_url, "tiny", requests).start()
    loose_load = BackgroundLoad(loose_url, "tiny", requests).start()
    try:
        (up,) = wait_for(
            lambda: scaled(cluster, namespace, "fast", r"1 -> 2"), SETTLE_S, what="fast to scale up"
        )
        wait_for(lambda: len(loose_load.outcomes()) > 20, SETTLE_S, what="loose to serve 20 requests")
        # The same load on loose over the same time did not scale it. Idle from now on, it may go
        # to zero after 30 s (its tier allowed it after an hour), which makes room on the local
        # node for fast's new pod.
        loose_outcomes = loose_load.stop()
        cluster.kubectl("patch", "servicetier", LOOSE, "--type=merge", "-p", IDLE_30_S)
        new = _new_pod_serving(cluster, namespace, first["metadata"]["name"])
    finally:
        fast_outcomes, loose_outcomes = fast_load.stop(), loose_load.stop()
    assert re.search(FAST_OVER, up), up
    assert not errors(fast_outcomes) and not errors(loose_outcomes)
    assert len(loose_outcomes) > 20 and scaled(cluster, namespace, "loose", r"-> 2") == []
    _warm(first)  # the first pod now holds a hot, shared prefix; the new one much less
    order = _scaled_in(cluster, namespace)
    assert order.startswith(f"coldest first: {new} goes first"), order
    assert [p["metadata"]["name"] for p in worker_pods(cluster, namespace, "fast")] == [
        first["metadata"]["name"]
    ]
    _back_from_zero(cluster, namespace, loose_url)


def _kv_size_reported(cluster: Cluster, namespace: str, pod: dict[str, Any]) -> None:
    """The worker's KV size per token reaches status.model, and an Event tells the owner that
    the spec (which gives none) should."""
    sample = pod_sample(pod)
    assert sample is not None and sample.kv_bytes_per_token, "the worker reports its model's KV size"

    def reported() -> int | None:
        model = (get(cluster, "inferenceservice", "fast", namespace).get("status") or {}).get("model") or {}
        told = any(e["reason"] == "KVBytesPerTokenUnset" for e in events(cluster, namespace, "fast"))
        return model.get("kvBytesPerToken") if told else None

    assert wait_for(reported, SETTLE_S, what="status.model and its Event") == sample.kv_bytes_per_token


def _new_pod_serving(cluster: Cluster, namespace: str, first: str) -> str:
    """Wait for the pod the scale-up added to be ready and to have served requests through the
    router (its own metrics count them); its name."""

    def serving() -> str | None:
        for pod in worker_pods(cluster, namespace, "fast"):
            sample = pod_sample(pod) if pod["metadata"]["name"] != first else None
            if sample is not None and sample.ttft_count >= 5:
                return str(pod["metadata"]["name"])
        return None

    return wait_for(serving, READY_S, what="the new pod to serve requests")


def _warm(pod: dict[str, Any]) -> None:
    """Requests sharing a long prefix straight to ``pod``: hit tokens in its own cache."""
    client = openai.OpenAI(
        base_url=f"http://{loopback_ip(pod)}:{WORKER_PORT}/v1", api_key="unused", max_retries=0
    )
    prefix = list(range(40, 40 + 96))
    for i in range(20):
        client.completions.create(model="tiny", prompt=[*prefix, 32 + i], max_tokens=1)


def _scaled_in(cluster: Cluster, namespace: str) -> str:
    """After the load: the ScaleInOrder Event of the scale-down, once its victim is gone."""

    def order() -> str | None:
        found = [e["message"] for e in events(cluster, namespace, "fast") if e["reason"] == "ScaleInOrder"]
        gone = len(worker_pods(cluster, namespace, "fast")) == 1
        return found[-1] if found and gone else None

    return wait_for(order, SETTLE_S, what="fast to scale back down to one pod")


def _back_from_zero(cluster: Cluster, namespace: str, url: str) -> None:
    """Idle, the loose service goes to zero; a request through its router wakes it and completes."""
    wait_for(lambda: scaled(cluster, namespace, "loose", r"1 -> 0"), SETTLE_S, what="loose to scale to zero")
    wait_for(lambda: not worker_pods(cluster, namespace, "loose"), SETTLE_S, what="loose's pod to go")
    client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=READY_S)
    answer = client.completions.create(model="tiny", prompt="wake up", max_tokens=2)
    assert answer.choices[0].text is not None
    assert scaled(cluster, namespace, "loose", r"0 -> 1"), "woken by the autoscaler, from the router's count"
    assert get(cluster, "inferenceservice", "loose", namespace)["spec"]["replicas"] == 1


def test_a_pod_deleted_under_load_finishes_its_requests_and_no_client_errs(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    if not CONVERSATION.exists():
        pytest.skip(f"{CONVERSATION} not present (set STRATA_TRACES_DIR)")
    spec = {"replicas": 2, "minReplicas": 1, "maxReplicas": 2, "autoscaling": {"mode": "off"}}
    cluster.apply(service("steady", FAST, **spec), namespace)
    url = ready_service(cluster, namespace, "steady")
    wait_for(lambda: len(worker_pods(cluster, namespace, "steady")) == 2, READY_S, what="two ready pods")
    victim = worker_pods(cluster, namespace, "steady")[0]
    name = victim["metadata"]["name"]
    steady = BackgroundLoad(url, "tiny", sized_load(url)).start()
    try:
        wait_for(lambda: _served(victim) >= 5, SETTLE_S, what=f"{name} to serve under the load")
        cluster.kubectl("delete", "pod", name, "-n", namespace, "--wait=false")
        wait_for(lambda: get(cluster, "pod", name, namespace) is None, SETTLE_S, what=f"{name} to go")
        sent_before = len(steady.outcomes())
        wait_for(lambda: len(steady.outcomes()) >= sent_before + 10, SETTLE_S, what="more requests after")
    finally:
        outcomes = steady.stop()
    assert not errors(outcomes), errors(outcomes)[:5]
    log = cluster.container_log(namespace, name, "engine")
    drained = [json.loads(line) for line in log.splitlines() if '"event": "drained"' in line]
    assert len(drained) == 1 and drained[0]["aborted"] == 0 and drained[0]["errors"] == 0, log[-2000:]


def _served(pod: dict[str, Any]) -> int:
    sample = pod_sample(pod)
    return int(sample.ttft_count) if sample is not None else 0
