"""The Strata stack on a test control plane: the chart installed, the operator running as its
ServiceAccount, and the small kubectl helpers everything above needs to wait on it.

Shared by the end-to-end tests (tests/operator), the demo (strata.demo) and the operator
benchmark (bench/bench_operator.py), so that all three exercise exactly the chart's RBAC, never
cluster-admin, and none of them imports from tests/. The operator runs here as a process, not as
the chart's Deployment, so that a test controls its settings and its lifetime; the workers' and
routers' pods run for real on the local node (strata.cluster's pod runtime), KWOK's elsewhere.

Modules: ``chart`` (install the chart), ``operator_process`` (run the operator), ``kube`` (get,
list, wait on objects), ``wait`` (bounded polling, free loopback ports), ``manifests``, ``local``
(what puts a service's pods on the local node, whose pods run for real).
"""

from strata.stack.chart import RELEASE, SERVICE_ACCOUNT, SYSTEM_NAMESPACE, install_chart
from strata.stack.kube import condition, events, get, items, running_pods, wait_ready
from strata.stack.local import local_pods_env, local_resources
from strata.stack.manifests import inference_service
from strata.stack.operator_process import (
    NVME_HOST_PATH,
    OperatorProcess,
    operator_argv,
    operator_env,
    operator_running,
)
from strata.stack.wait import free_port, wait_for

__all__ = [
    "NVME_HOST_PATH",
    "RELEASE",
    "SERVICE_ACCOUNT",
    "SYSTEM_NAMESPACE",
    "OperatorProcess",
    "condition",
    "events",
    "free_port",
    "get",
    "inference_service",
    "install_chart",
    "items",
    "local_pods_env",
    "local_resources",
    "operator_argv",
    "operator_env",
    "operator_running",
    "running_pods",
    "wait_for",
    "wait_ready",
]
