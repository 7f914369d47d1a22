"""A real Kubernetes control plane for tests and the local demo.

etcd, kube-apiserver (RBAC, real certificates), kube-controller-manager, kube-scheduler and KWOK
on loopback, with fake GPU nodes. ``start_cluster`` for scripts, the ``cluster``/``namespace``
pytest fixtures (strata.cluster.pytest_plugin) for tests, ``strata cluster up|down|env|status``
for people. The API is documented in docs/cluster.md.
"""

from strata.cluster.binaries import MissingBinariesError, find_bin_dir
from strata.cluster.cluster import Cluster, ClusterConfig, KubectlError
from strata.cluster.nodes import GpuNodeShape
from strata.cluster.startup import ClusterStartError, launch, start_cluster

__all__ = [
    "Cluster",
    "ClusterConfig",
    "ClusterStartError",
    "GpuNodeShape",
    "KubectlError",
    "MissingBinariesError",
    "find_bin_dir",
    "launch",
    "start_cluster",
]
