"""Install charts/strata the way a user does: ``helm upgrade --install``, with no operator pods.

The operator runs on this machine instead (strata.stack.operator_process), as the chart's
ServiceAccount. Helm never upgrades the CRDs of its crds/ folder once installed (the chart's
pre-upgrade hook Job does, which KWOK only pretends to run), so they are server-side applied
first, current on a reused cluster too, and Helm skips them. Install returns only once the API server admits
InferenceServices: right after a fresh install the admission policy refuses them for some seconds
while the ServiceTier CRD (its parameter kind) is discovered (docs/api.md)."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from strata.cluster.binaries import REPO_ROOT
from strata.cluster.cluster import Cluster, KubectlError
from strata.stack.manifests import inference_service

CHART = REPO_ROOT / "charts" / "strata"
RELEASE = "strata"
SYSTEM_NAMESPACE = "strata-system"
SERVICE_ACCOUNT = RELEASE  # the chart names its ServiceAccount after the release
# Cluster-scoped objects carry the namespace too (the ClusterKopfPeering among them).
PEERING = f"{RELEASE}-{SYSTEM_NAMESPACE}"
ADMISSION_TIMEOUT_S = 120.0
NOT_YET_ADMITTED = "paramKind"  # the policy's parameter kind is not discovered yet


def install_chart(
    cluster: Cluster, timeout_s: float = ADMISSION_TIMEOUT_S, values: Mapping[str, Any] | None = None
) -> Path:
    """Install (or upgrade) the chart; returns a kubeconfig of its ServiceAccount. Without
    ``values``, with no operator pods (the operator runs as a process); with them, exactly those
    values (e.g. the operator's pods on a local node, where the pod runtime runs them)."""
    _apply_crds(cluster)
    helm = [str(cluster.bin_dir / "helm"), "--kubeconfig", str(cluster.kubeconfig)]
    args = ["upgrade", "--install", RELEASE, str(CHART), "-n", SYSTEM_NAMESPACE, "--create-namespace"]
    given = ["--set", "operator.replicas=0"] if values is None else ["--values", "-"]
    done = subprocess.run(
        # --take-ownership: objects of the chart's names applied without helm (crds/, examples/) are
        # adopted rather than refused, as an admin upgrading from a kubectl-applied install expects.
        [*helm, *args, "--skip-crds", "--take-ownership", *given],
        input=json.dumps(values or {}),
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout_s,
    )
    if done.returncode != 0:
        raise RuntimeError(f"helm {' '.join(args)} failed: {done.stderr.strip()}")
    wait_admitted(cluster, timeout_s)
    return cluster.service_account_kubeconfig(SYSTEM_NAMESPACE, SERVICE_ACCOUNT)


def _apply_crds(cluster: Cluster) -> None:
    crds = CHART / "crds"
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crds))
    for path in sorted(crds.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc["kind"] == "CustomResourceDefinition":
                name = doc["metadata"]["name"]
                cluster.kubectl("wait", "--for=condition=Established", f"crd/{name}", "--timeout=60s")


def wait_admitted(
    cluster: Cluster, timeout_s: float = ADMISSION_TIMEOUT_S, namespace: str = SYSTEM_NAMESPACE
) -> None:
    """Until a server-side dry-run create of an InferenceService passes the admission policy."""
    probe = yaml.safe_dump(inference_service("admission-probe"))
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            cluster.kubectl("create", "--dry-run=server", "-n", namespace, "-f", "-", input=probe)
            return
        except KubectlError as exc:
            if NOT_YET_ADMITTED not in str(exc):
                raise
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"InferenceServices still refused {timeout_s:.0f}s after install: {exc}"
                ) from exc
        time.sleep(1)
