"""The demo's Prometheus: the chart's monitors (kubernetes_sd, loopback only), which find the
pods the cluster's pod runtime runs (workers, sidecars, routers) at their pod IPs, plus the one
process the demo runs on this machine instead of in a pod (the operator), labelled as its pod
would be, so the rules and the dashboard's queries have data."""

from __future__ import annotations

from pathlib import Path

from strata.cluster.cluster import Cluster
from strata.demo.detached import Detached
from strata.observe.monitors import static_job
from strata.observe.prometheus import prepare, wait_ready
from strata.stack.chart import SYSTEM_NAMESPACE

START_TIMEOUT_S = 300.0  # a bound, not a wait: ready returns at once; a loaded machine is slow


def start_prometheus(detached: Detached, cluster: Cluster, directory: Path, operator_port: int) -> str:
    """Prometheus left running (``strata demo down`` stops it); returns its URL."""
    operator = static_job(
        "demo/operator", f"127.0.0.1:{operator_port}", {"namespace": SYSTEM_NAMESPACE, "pod": "operator"}
    )
    detached.stop("prometheus")
    argv, url = prepare(directory / "prometheus", cluster, interval="5s", extra_jobs=[operator])
    proc = detached.start("prometheus", argv)
    wait_ready(url, START_TIMEOUT_S, proc)
    return url
