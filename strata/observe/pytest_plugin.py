"""The ``prometheus`` fixture: one real Prometheus per test session, started only when a test
asks for it, scraping the test control plane through the chart's monitors (loopback only)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from strata.cluster.cluster import Cluster
from strata.observe.prometheus import Prometheus, PrometheusError, start_prometheus


@pytest.fixture(scope="session")
def prometheus(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    try:
        server = start_prometheus(tmp_path_factory.mktemp("prometheus"), cluster)
    except PrometheusError as error:
        pytest.fail(str(error), pytrace=False)
    try:
        yield server
    finally:
        server.stop()
