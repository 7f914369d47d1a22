"""`helm install`, a second release beside the first, `helm upgrade` and `helm uninstall` on the
test control plane, as docs/operator.md ("Upgrades and uninstall", "Several releases in one
cluster") says they behave. The operator pods land on KWOK nodes (nothing runs): this is about
what Helm creates, changes and removes; the CRD upgrade hook runs for real on the local node."""

from __future__ import annotations

import json
import re
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from strata.cluster import Cluster
from strata.cluster.nodes import LOCAL_TOLERATION, POD_RUNTIME_LABEL, POD_RUNTIME_LOCAL
from strata.stack import free_port, get, inference_service, items, wait_for
from strata.stack.chart import CHART, RELEASE, SYSTEM_NAMESPACE, install_chart, wait_admitted

from .test_chart import apply_older_servicetier_crd, printer_columns, printer_columns_of

pytestmark = pytest.mark.cluster

SECOND_RELEASE = (
    "admissionPolicy.install=false",
    "serviceTiers.install=false",
    "crds.upgrade=false",
    "operator.replicas=1",
)
POLICY = "strata-inferenceservice-tier-limits"
TEST_POD = f"{RELEASE}-test-ready"
# What Helm may wait for a rollout or the test pod: generous, a slow machine's cold start included.
HELM_WAIT = "10m"
WAIT_S = 600.0
# The operator's pods and the hook Job where the local pod runtime runs them (KWOK's nodes only
# pretend: a Job there completes without running).
ON_THE_LOCAL_NODE = (
    f"--set-json=operator.tolerations={json.dumps([LOCAL_TOLERATION])}",
    f"--set-json=operator.nodeSelector={json.dumps({POD_RUNTIME_LABEL: POD_RUNTIME_LOCAL})}",
)


def helm(cluster: Cluster, *args: str) -> str:
    argv = [str(cluster.bin_dir / "helm"), "--kubeconfig", str(cluster.kubeconfig), *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"helm {' '.join(args)}:\n{done.stderr[-3000:]}"
    return done.stdout


def release(cluster: Cluster, verb: str, namespace: str, *options: str) -> str:
    """``helm <verb> strata`` in ``namespace``; options are flags (``--x``) or values (``a.b=c``)."""
    argv = [a for o in options for a in ((o,) if o.startswith("--") else ("--set", o))]
    return helm(cluster, verb, RELEASE, str(CHART), "-n", namespace, *argv)


def owner(obj: dict[str, Any] | None) -> str | None:
    """The namespace of the release that owns ``obj`` (Helm's annotation), None if absent."""
    return None if obj is None else obj["metadata"]["annotations"].get("meta.helm.sh/release-namespace")


@pytest.fixture
def two_namespaces(cluster: Cluster) -> Iterator[tuple[str, str]]:
    """Two fresh namespaces; afterwards the session's own release (strata.stack), if it was
    installed, gets back the tiers and the policy that the first release here took over."""
    suffix = uuid.uuid4().hex[:6]
    names = (f"strata-a-{suffix}", f"strata-b-{suffix}")
    stack_installed = get(cluster, "deployment", RELEASE, SYSTEM_NAMESPACE) is not None
    for name in names:
        cluster.kubectl("create", "namespace", name)
    try:
        yield names
    finally:
        for name in names:
            helm_quiet(cluster, "uninstall", RELEASE, "-n", name, "--ignore-not-found")
            cluster.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)
        if stack_installed:
            install_chart(cluster)


def helm_quiet(cluster: Cluster, *args: str) -> None:
    argv = [str(cluster.bin_dir / "helm"), "--kubeconfig", str(cluster.kubeconfig), *args]
    subprocess.run(argv, capture_output=True, timeout=300, check=False)


def test_two_releases_install_upgrade_and_uninstall_as_documented(
    cluster: Cluster, two_namespaces: tuple[str, str]
) -> None:
    a, b = two_namespaces
    # The first release: everything, the one-per-cluster objects included (taking them over from
    # the session's own release when there is one). No --skip-crds: Helm skips existing CRDs.
    release(cluster, "install", a, "--take-ownership", "operator.replicas=1")
    # A second release of the same name in another namespace, without them: no name collides.
    release(cluster, "install", b, "--skip-crds", *SECOND_RELEASE, f"operator.watchNamespaces={{{b}}}")
    for ns in (a, b):
        binding = get(cluster, "clusterrolebinding", f"{RELEASE}-{ns}")
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": RELEASE, "namespace": ns}]
    assert owner(get(cluster, "servicetier", "premium")) == a
    assert owner(get(cluster, "validatingadmissionpolicy", POLICY)) == a
    args = get(cluster, "deployment", RELEASE, b)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"--namespace={b}" in args and "--standalone" in args

    # An upgrade with changed values and a changed CRD: the pre-upgrade hook Job, run for real on
    # the local node, applies this version's CRDs, then the values reach the objects.
    current = apply_older_servicetier_crd(cluster)
    tier = "serviceTiers.tiers.premium.cache.dram.maxSize=123Gi"
    release(cluster, "upgrade", a, *ON_THE_LOCAL_NODE, "operator.replicas=0", tier)
    assert printer_columns(cluster) == printer_columns_of(current)
    assert get(cluster, "servicetier", "premium")["spec"]["cache"]["dram"]["maxSize"] == "123Gi"

    wait_admitted(cluster, namespace=a)
    cluster.kubectl("apply", "-n", a, "-f", "-", input=json.dumps(inference_service("kept")))
    helm(cluster, "uninstall", RELEASE, "-n", b)
    assert get(cluster, "clusterrole", f"{RELEASE}-{b}") is None
    assert get(cluster, "servicetier", "premium") is not None, "the second release removed the first's tiers"
    helm(cluster, "uninstall", RELEASE, "-n", a)
    for kind, name in (
        ("clusterrole", f"{RELEASE}-{a}"),
        ("servicetier", "premium"),
        ("validatingadmissionpolicy", POLICY),
    ):
        assert get(cluster, kind, name) is None, f"{kind} {name} outlived the uninstall"
    # The CRDs stay, and with them every InferenceService.
    assert get(cluster, "crd", "inferenceservices.strata.dev") is not None
    assert get(cluster, "inferenceservice", "kept", a) is not None


@pytest.fixture
def fresh_namespace(cluster: Cluster) -> Iterator[str]:
    name = f"strata-t-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        helm_quiet(cluster, "uninstall", RELEASE, "-n", name, "--ignore-not-found", "--wait")
        cluster.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


def helm_test(cluster: Cluster, namespace: str) -> subprocess.CompletedProcess[str]:
    """``helm test`` as an admin runs it; Helm waits for the test pod (generously bounded)."""
    argv = [str(cluster.bin_dir / "helm"), "--kubeconfig", str(cluster.kubeconfig)]
    argv += ["test", RELEASE, "-n", namespace, "--timeout", HELM_WAIT]
    return subprocess.run(argv, capture_output=True, text=True, timeout=900)


def test_helm_test_reaches_the_operator_through_its_service_and_fails_without_one(
    cluster: Cluster, fresh_namespace: str
) -> None:
    ns = fresh_namespace
    # The operator and the test pod on the local node, where they run for real; this release
    # serves only its namespace and takes no cluster-wide object (as the second release above).
    # Pods share the host's ports there: free ones.
    ports = (f"operator.livenessPort={free_port()}", f"operator.metricsPort={free_port()}")
    where = (*ON_THE_LOCAL_NODE, *SECOND_RELEASE, f"operator.watchNamespaces={{{ns}}}", *ports)
    release(cluster, "install", ns, *where, "--wait", f"--timeout={HELM_WAIT}")
    service = get(cluster, "service", f"{RELEASE}-metrics", ns)
    liveness = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "liveness")

    passed = helm_test(cluster, ns)
    assert passed.returncode == 0, f"helm test failed:\n{passed.stdout}\n{passed.stderr[-3000:]}"
    assert re.search(r"Phase:\s+Succeeded", passed.stdout), passed.stdout
    # Through the Service's ClusterIP (the runtime's proxy), found by the kubelet's variables.
    url = f"http://{service['spec']['clusterIP']}:{liveness}/healthz"
    assert f"operator ready: {url} answered 200" in cluster.container_log(ns, TEST_POD, "ready")

    # No operator replica: no Ready pod behind the Service, so the test pod fails (after its own
    # short wait: nothing can answer) and `helm test` with it.
    release(cluster, "upgrade", ns, "--reuse-values", "operator.replicas=0", "test.timeoutSeconds=3")
    wait_for(
        lambda: not items(cluster, "pods", ns, "app.kubernetes.io/component=operator"),
        WAIT_S,
        "the operator's pods gone",
    )
    failed = helm_test(cluster, ns)
    assert failed.returncode != 0, f"helm test passed with no operator:\n{failed.stdout}"
    assert re.search(r"Phase:\s+Failed", failed.stdout) or f"{TEST_POD} failed" in failed.stderr, (
        failed.stderr
    )
    log = cluster.container_log(ns, TEST_POD, "ready")
    assert f"operator not ready after 3 s: {url}" in log, log
