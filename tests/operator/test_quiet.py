"""On the way to Ready the operator reconciles each service at most twice, and once everything is
Ready it costs the API server nothing per service, though the autoscaler scrapes every second:
counted by the operator's own client metrics and by the API server itself (a FlowSchema puts the
operator's ServiceAccount in a flow of its own, whose requests API Priority and Fairness counts)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from bench import fleet
from strata.cluster.cluster import Cluster
from strata.stack import inference_service, operator_running, wait_ready

pytestmark = pytest.mark.cluster
SERVICES = 6
IDLE_S = 45
WATCHES = 11  # resources the operator watches: at most one stream re-opened each in the window
CLIENT_REQUESTS = "strata_operator_api_requests_total"


def operator_requests(cluster: Cluster) -> float:
    text = fleet.apiserver_metrics(cluster)
    return fleet.samples(
        text, "apiserver_flowcontrol_dispatched_requests_total", flow_schema=fleet.FLOW_SCHEMA
    )


def test_two_reconciles_at_most_to_ready_and_nothing_per_service_at_rest(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    cluster.apply(fleet.flow_schema())
    options = {
        "args": ["--standalone", f"--namespace={namespace}"],
        "env": {"STRATA_AUTOSCALE_INTERVAL_S": "1"},
    }
    with operator_running(cluster, tmp_path / "operator.log", **options) as operator:
        for i in range(SERVICES):
            cluster.apply(inference_service(f"quiet-{i}"), namespace)
        for i in range(SERVICES):
            wait_ready(cluster, namespace, f"quiet-{i}", timeout_s=300)
        assert operator.metric("strata_operator_reconciles_total") <= 2 * SERVICES
        time.sleep(5)  # the last Events and status writes of the way to Ready land
        client, server = operator.metric(CLIENT_REQUESTS), operator_requests(cluster)
        time.sleep(IDLE_S)  # about 45 autoscaler intervals
        assert operator.metric(CLIENT_REQUESTS) == client, "the operator's client wrote or read at rest"
        assert operator_requests(cluster) - server <= WATCHES
