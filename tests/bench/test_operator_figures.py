"""The operator benchmark's pure pieces: where a phase's time went (histogram quantiles between
two scrapes), a service counted only once both its Deployments exist, and a smaller run's size."""

from __future__ import annotations

import os
import time

from bench import fleet
from bench.bench_operator import Scale, _every_deployment, requests_by_kind

TEXT = """# HELP x_seconds ...
x_seconds_bucket{le="0.1"} {a}
x_seconds_bucket{le="1.0"} {b}
x_seconds_bucket{le="+Inf"} {c}
x_seconds_count {c}
"""


def scrape(a: int, b: int, c: int) -> str:
    return TEXT.replace("{a}", str(a)).replace("{b}", str(b)).replace("{c}", str(c))


def test_quantiles_count_only_what_was_observed_between_two_scrapes() -> None:
    before = fleet.buckets(scrape(90, 100, 100), "x_seconds")
    after = fleet.buckets(scrape(91, 150, 200), "x_seconds")  # 1 fast, 49 under 1 s, 50 slower
    assert fleet.quantile(before, after, 0.5) == 1.0
    assert fleet.quantile(before, after, 0.99) == float("inf")
    assert fleet.quantile(before, before, 0.5) is None  # nothing observed in between


def test_a_service_has_every_child_once_both_its_deployments_were_seen() -> None:
    key = _every_deployment()

    def deployment(name: str) -> dict[str, object]:
        labels = {"strata.dev/inferenceservice": "chat"}
        return {"metadata": {"name": name, "namespace": "a", "labels": labels}}

    assert key(deployment("chat")) is None
    assert key(deployment("chat")) is None  # the same one again
    assert key(deployment("chat-router")) == ("a", "chat")
    assert key({"metadata": {"name": "other", "namespace": "a"}}) is None


def test_a_smaller_run_keeps_the_rate_and_has_a_gpu_for_every_service() -> None:
    small = Scale.sized(300)
    assert (small.services, small.rate_per_s, small.steady_s) == (300, 10.0, 30.0)
    assert small.nodes * small.gpus_per_node >= 600
    assert Scale.sized(1000).steady_s == Scale().steady_s


def test_the_api_servers_mean_latency_per_request_kind_between_two_scrapes() -> None:
    def metrics(apply_sum: float, apply_count: int, status_count: int) -> str:
        name = "apiserver_request_duration_seconds"
        services = 'component="apiserver",group="",resource="services",scope="resource",subresource=""'
        status = 'component="apiserver",group="apps",resource="deployments",subresource="status"'
        return "\n".join(
            [
                f'{name}_sum{{{services},verb="APPLY",version="v1"}} {apply_sum}',
                f'{name}_count{{{services},verb="APPLY",version="v1"}} {apply_count}',
                f'{name}_sum{{{status},verb="PUT",version="v1"}} {status_count * 0.1}',
                f'{name}_count{{{status},verb="PUT",version="v1"}} {status_count}',
            ]
        )

    before, after = metrics(10.0, 100, 5), metrics(40.0, 110, 5)
    # 10 applies of Services in between took 30 s; no status update happened in between
    assert fleet.mean_latencies(before, after) == {"APPLY services": 3.0}


def test_the_raw_phase_writes_the_operators_own_children_owned_by_nothing() -> None:
    children = fleet.unowned_children("tenant-0", "svc-0")
    assert [c["kind"] for c in children].count("Deployment") == 2  # the workload and the router's
    assert len(children) == len(fleet.child_sizes()) == 10
    assert all("ownerReferences" not in c["metadata"] for c in children)
    assert all("ownerReferences" in c["metadata"] for c in fleet.rendered_children("tenant-0", "svc-0"))


def test_requests_per_service_split_into_children_status_events_and_the_rest() -> None:
    active = {
        "writes": 1230.0,  # every patch the client sent: 1,000 children, 200 status, 30 tier status
        "status_writes": 200.0,
        "tier_status_writes": 30.0,
        "events": 200.0,
        "operator_requests": 1450.0,  # as the API server counted them: Events and watches too
    }
    assert requests_by_kind(active, 100) == {"children": 10.0, "status": 2.0, "events": 2.0, "other": 0.5}


def test_a_phase_cpu_meter_sees_a_process_burn_and_the_machine_busy() -> None:
    """Busy share of all cores between 0 and 1, and the measured process's own CPU-seconds."""
    meter = fleet.CpuMeter(os.getpid())
    spent = time.process_time()
    while time.process_time() - spent < 0.3:
        sum(range(10_000))
    read = meter.read("phase")
    assert 0.25 <= read["phase_apiserver_cpu_s"] <= 5
    assert 0 < read["phase_machine_busy"] <= 1
