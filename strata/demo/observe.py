"""The demo's Prometheus: the chart's monitors (kubernetes_sd, loopback only), plus the processes
the demo runs on this machine instead of in pods (operator, worker, KV-tier sidecar), labelled as
their pods would be, so the rules and the dashboard's queries have data."""

from __future__ import annotations

from pathlib import Path

from strata.cluster.cluster import Cluster
from strata.demo.detached import Detached
from strata.observe.monitors import static_job
from strata.observe.prometheus import prepare, wait_ready
from strata.stack.chart import SYSTEM_NAMESPACE

START_TIMEOUT_S = 300.0  # a bound, not a wait: ready returns at once; a loaded machine is slow


def start_prometheus(
    detached: Detached,
    cluster: Cluster,
    directory: Path,
    operator_port: int,
    service: tuple[str, str, str],
    worker_addresses: tuple[str, str],
) -> str:
    """Prometheus left running (``strata demo down`` stops it); returns its URL."""
    namespace, name, tier = service
    labels = {"namespace": namespace, "service": name, "service_tier": tier, "pod": f"{name}-local"}
    jobs = [
        static_job(
            "demo/operator", f"127.0.0.1:{operator_port}", {"namespace": SYSTEM_NAMESPACE, "pod": "operator"}
        ),
        static_job("demo/worker", worker_addresses[0], labels),
        static_job("demo/kvtier", worker_addresses[1], labels),
    ]
    detached.stop("prometheus")
    argv, url = prepare(directory / "prometheus", cluster, interval="5s", extra_jobs=jobs)
    proc = detached.start("prometheus", argv)
    wait_ready(url, START_TIMEOUT_S, proc)
    return url
