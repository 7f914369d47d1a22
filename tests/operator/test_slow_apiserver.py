"""A deliberately slowed API server: the operator reaches it through a latency proxy on loopback
that delays every request and stalls some far beyond the client's timeout. No reconcile fails
for a timeout that a retry with back-off absorbs, and every service still converges."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from strata.cluster.cluster import Cluster
from strata.stack import OperatorProcess, inference_service, install_chart, wait_ready
from strata.stack.latency_proxy import LatencyProxy

pytestmark = pytest.mark.cluster
SERVICES = 5
FAILED = re.compile(r"reconcile (of \S+ )?failed")


def test_stalled_requests_are_retried_and_every_service_converges(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    upstream = int(cluster.api_url.rsplit(":", 1)[1])
    proxy = LatencyProxy(upstream, latency_s=0.2, jitter_s=0.2, stall_s=6.0, stall_every=10).start()
    try:
        kubeconfig = proxy.kubeconfig(install_chart(cluster), tmp_path / "slow.kubeconfig")
        # A 2 s timeout floor: the 6 s stalls outlast it, the 0.2-0.4 s answers never do.
        env = {"STRATA_API_TIMEOUT_S": "2"}
        operator = OperatorProcess(kubeconfig, tmp_path / "operator.log", env=env).start()
        try:
            for i in range(SERVICES):
                cluster.apply(inference_service(f"slow-{i}"), namespace)
            for i in range(SERVICES):
                wait_ready(cluster, namespace, f"slow-{i}", timeout_s=600)
            assert proxy.stalls > 0
            assert operator.metric("strata_operator_api_retries_total") > 0, "no stall reached the client"
            assert operator.metric("strata_operator_reconcile_errors_total") == 0
            assert not FAILED.search(operator.log.read_text())
        finally:
            operator.stop()
    finally:
        proxy.stop()
