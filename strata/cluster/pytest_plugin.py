"""pytest fixtures for the test control plane; registered from tests/conftest.py.

``cluster`` is session-scoped: the suite pays the start-up (about half a minute) once; it has
four KWOK GPU nodes and one local node (``local-node-0``) whose pods run for real. When the
binaries are missing it fails rather than skips, so a CI run cannot pass without really running
the cluster tests. Set ``STRATA_CLUSTER_DIR`` to the directory of a running ``strata cluster up``
to reuse that cluster instead of starting one (fast local iteration).
"""

from __future__ import annotations

import os
import re
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from strata.cluster.binaries import MissingBinariesError, find_bin_dir
from strata.cluster.cluster import NODES_READY_S, Cluster, ClusterConfig
from strata.cluster.startup import ClusterStartError, launch

# Four KWOK GPU nodes and one tainted local node, whose pods (those tolerating
# strata.cluster.nodes.LOCAL_TAINT) the local pod runtime runs as real processes.
SESSION_CONFIG = ClusterConfig(gpu_nodes=4, local_nodes=1)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    reuse = os.environ.get("STRATA_CLUSTER_DIR")
    if reuse:
        yield Cluster.attach(Path(reuse))
        return
    try:
        bin_dir = find_bin_dir()
    except MissingBinariesError as error:
        pytest.fail(str(error), pytrace=False)
    handle = _launch_retrying(tmp_path_factory, bin_dir)
    try:
        yield handle
    finally:
        handle.stop()


def _launch_retrying(tmp_path_factory: pytest.TempPathFactory, bin_dir: Path) -> Cluster:
    """The session's cluster; a start that failed is tried once more in a fresh directory: one
    failed start (a component slow past its bound on a loaded machine) would otherwise error
    every cluster test of the run. Under pytest's basetemp, so both attempts' logs stay."""
    try:
        return launch(tmp_path_factory.mktemp("cluster"), SESSION_CONFIG, bin_dir=bin_dir)
    except ClusterStartError as error:
        warnings.warn(f"the session cluster did not start, trying once more: {error}", stacklevel=1)
    return launch(tmp_path_factory.mktemp("cluster"), SESSION_CONFIG, bin_dir=bin_dir)


def namespace_name(test_name: str) -> str:
    """A valid, unique namespace name derived from the test's name (DNS label, <= 63 chars)."""
    stem = re.sub(r"[^a-z0-9-]+", "-", test_name.lower()).strip("-")[:48].rstrip("-") or "test"
    return f"{stem}-{uuid.uuid4().hex[:6]}"


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace (with its default ServiceAccount) per test, deleted afterwards."""
    name = namespace_name(request.node.name)
    cluster.kubectl("create", "namespace", name)
    cluster.kubectl(
        "wait",
        "--for=create",
        "serviceaccount/default",
        "-n",
        name,
        f"--timeout={NODES_READY_S:.0f}s",  # seconds normally; minutes on a loaded machine
    )
    try:
        yield name
    finally:
        # Don't wait: namespace finalization runs in the background while the next test starts.
        cluster.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)
