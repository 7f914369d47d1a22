"""The Helm chart: lints, its values schema, the operator with peering, RBAC, the upgrade hook."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from strata.cluster import Cluster
from strata.cluster.binaries import find_bin_dir
from strata.cluster.podruntime import env as envs
from strata.cluster.podruntime import services
from strata.cluster.podruntime.spec import parse_pod
from strata.operator.api import generate
from strata.operator.settings import ROUTER_RESOURCES, settings_from_env

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "strata"

pytestmark = pytest.mark.cluster  # needs bin/helm from `make cluster-bins`


def helm(*args: str) -> str:
    return subprocess.run(
        [str(find_bin_dir() / "helm"), *args], capture_output=True, text=True, check=True
    ).stdout


def helm_error(*args: str) -> str:
    """Run helm expecting it to fail; its error output."""
    done = subprocess.run([str(find_bin_dir() / "helm"), *args], capture_output=True, text=True)
    assert done.returncode != 0, f"helm {' '.join(args)} should have failed:\n{done.stdout[-2000:]}"
    return done.stderr


# `helm template` assumes Kubernetes 1.20 unless told (a helm built without Helm's release ldflags),
# which the chart's kubeVersion refuses: render for the test control plane's version.
KUBE_VERSION = "1.34.4"


def render(*sets: str, release: str = "strata") -> list[dict[str, Any]]:
    argv = ["template", release, str(CHART), "-n", "strata-system", "--kube-version", KUBE_VERSION]
    for s in sets:
        argv += ["--set", s]
    return [d for d in yaml.safe_load_all(helm(*argv)) if d]


def template_error(*sets: str) -> str:
    sets_argv = [a for s in sets for a in ("--set", s)]
    return helm_error("template", "strata", str(CHART), "--kube-version", KUBE_VERSION, *sets_argv)


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def test_chart_lints():
    assert "0 chart(s) failed" in helm("lint", "--strict", str(CHART))


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ("operator.replicas=-1", "/operator/replicas"),
        (
            "serviceTiers.tiers.premium.cache.dram.eviction=fifo",
            "/serviceTiers/tiers/premium/cache/dram/eviction",
        ),
        (
            "serviceTiers.tiers.premium.cache.nvme.maxSize=12XB",
            "/serviceTiers/tiers/premium/cache/nvme/maxSize",
        ),
        ("operator.replica=3", "replica"),  # a typo is not silently ignored
        ("worker.nvmeVolume=nfs", "/worker/nvmeVolume"),
        ("worker.imagePullSecrets[0].nam=x", "/worker/imagePullSecrets/0"),
        ("serviceTiers.tiers.Gold.priority=1", "Gold"),
        ("router.resources.requests.cpu=lots", "/router/resources/requests/cpu"),
    ],
)
def test_values_schema_refuses_bad_values_naming_them(value: str, named: str) -> None:
    error = template_error(value)
    assert "values don't meet the specifications of the schema" in error
    assert named in error, error


def test_kubernetes_older_than_1_30_is_refused() -> None:
    error = helm_error("template", "strata", str(CHART), "--kube-version", "1.29.0")
    assert "kubeVersion" in error and ">=1.30.0-0" in error


def test_tier_overrides_merge_over_the_defaults_and_add_tiers() -> None:
    tiers = {
        t["metadata"]["name"]: t["spec"]
        for t in by_kind(
            render(
                "serviceTiers.tiers.premium.cache.dram.maxSize=256Gi",
                "serviceTiers.tiers.gold.priority=2000000",
            ),
            "ServiceTier",
        )
    }
    default = yaml.safe_load((CHART / "files" / "servicetiers" / "premium.yaml").read_text())["spec"]
    assert tiers["premium"]["cache"]["dram"] == {**default["cache"]["dram"], "maxSize": "256Gi"}
    assert tiers["premium"]["priority"] == default["priority"] == 1000000  # an int, not 1e+06
    assert tiers["premium"]["slo"] == default["slo"]
    assert tiers["gold"] == {"priority": 2000000}
    assert set(tiers) == {"premium", "standard", "batch", "gold"}


def test_notes_say_what_to_do_next_and_warn_about_the_policy_delay(cluster: Cluster) -> None:
    # The CRDs first, as Helm installs them (a dry run does not, and its objects need their kinds):
    # alone or after tests/api only, nothing has installed kopf's peering CRD yet.
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CHART / "crds"))
    cluster.kubectl("wait", "--for=condition=Established", "-f", str(CHART / "crds"), "--timeout=300s")
    # A server-side dry run renders for the cluster's version and creates nothing.
    notes = helm(
        "install",
        "strata",
        str(CHART),
        "-n",
        "strata-system",
        "--dry-run=server",
        "--kubeconfig",
        str(cluster.kubeconfig),
    )
    notes = notes.split("NOTES:", 1)[1]
    assert "rollout status deployment/strata" in notes and "helm test strata" in notes
    assert "enforced only a few" in notes and "TierLimitsExceeded" in notes
    assert "pre-upgrade hook" in notes


def test_operator_pdb_takes_one_replica_at_a_time() -> None:
    (pdb,) = by_kind(render(), "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert (
        pdb["spec"]["selector"]["matchLabels"]
        == by_kind(render(), "Deployment")[0]["spec"]["selector"]["matchLabels"]
    )
    assert by_kind(render("operator.podDisruptionBudget.enabled=false"), "PodDisruptionBudget") == []


def test_pull_secrets_annotations_and_labels_reach_the_pods() -> None:
    docs = render(
        "imagePullSecrets[0].name=opregcred",
        "worker.imagePullSecrets[0].name=regcred",
        "operator.podAnnotations.team=ml",
        "operator.podLabels.cost-center=ml-platform",
        "serviceAccount.annotations.iam\\.example/role=strata",
    )
    (deployment,) = by_kind(docs, "Deployment")
    pod = deployment["spec"]["template"]
    assert pod["spec"]["imagePullSecrets"] == [{"name": "opregcred"}]
    assert pod["metadata"]["annotations"] == {"team": "ml"}
    assert pod["metadata"]["labels"]["cost-center"] == "ml-platform"
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert json.loads(env["STRATA_IMAGE_PULL_SECRETS"]) == [{"name": "regcred"}]
    (sa,) = [s for s in by_kind(docs, "ServiceAccount") if s["metadata"]["name"] == "strata"]
    assert sa["metadata"]["annotations"] == {"iam.example/role": "strata"}


def test_router_placement_and_resources_reach_the_operator_settings() -> None:
    docs = render("router.nodeSelector.pool=cpu", "router.resources.requests.cpu=50m")
    settings = settings_from_env(env_of(docs))
    assert settings.router_node_selector == (("pool", "cpu"),)
    assert settings.router_resources.manifest() == {
        "requests": {"cpu": "50m", "memory": "256Mi"},
        "limits": {"memory": "1Gi"},
    }
    assert settings_from_env(env_of(render())).router_resources == ROUTER_RESOURCES
    assert settings_from_env(env_of(render())).metrics_host == "127.64.1.2"


def env_of(docs: list[dict[str, Any]]) -> dict[str, str]:
    """The operator container's environment as a kubelet resolves it (the pod at a sample IP)."""
    (deployment,) = by_kind(docs, "Deployment")
    meta = {"name": "op", "namespace": "strata-system", "uid": "u"}
    pod = parse_pod({"metadata": meta, "spec": deployment["spec"]["template"]["spec"]})
    return envs.container_env(pod.spec.containers[0], envs.PodFacts(pod, "127.64.1.2", "127.0.0.1"), {}, {})


def test_fullname_override_names_every_object_and_the_peering_follows_the_release() -> None:
    docs = render("fullnameOverride=llm")
    named = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert {("Deployment", "llm"), ("Service", "llm-metrics"), ("ClusterRole", "llm-strata-system")} <= named
    (deployment,) = by_kind(docs, "Deployment")
    assert "--peering=llm-strata-system" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    # Two releases never share a peering object (they would pause each other's replicas).
    other = by_kind(render(release="other"), "ClusterKopfPeering")[0]["metadata"]["name"]
    assert (
        other
        == "other-strata-strata-system"
        != by_kind(render(), "ClusterKopfPeering")[0]["metadata"]["name"]
    )


def test_admission_policy_is_a_template_so_helm_upgrades_it() -> None:
    kinds = {d["kind"] for d in render()}
    assert {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} <= kinds
    assert not list((CHART / "crds").glob("*policy*"))


def test_crd_upgrade_hook_may_patch_only_strata_crds() -> None:
    docs = render()
    (job,) = by_kind(docs, "Job")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-upgrade"
    assert job["spec"]["template"]["spec"]["containers"][0]["args"] == ["crds", "apply"]
    role = next(r for r in by_kind(docs, "ClusterRole") if r["metadata"]["name"].endswith("crds-upgrade"))
    (rule,) = role["rules"]
    assert rule["verbs"] == ["get", "patch"]
    assert set(rule["resourceNames"]) == {c["metadata"]["name"] for c in generate.crds()}
    assert by_kind(render("crds.upgrade=false"), "Job") == []


def test_helm_test_hook_checks_the_operator_liveness_through_its_service_variables() -> None:
    for sets, name in (((), "strata-metrics"), (("fullnameOverride=my-llm",), "my-llm-metrics")):
        docs = render(*sets, "operator.nodeSelector.pool=ops")
        (pod,) = [d for d in docs if d["metadata"]["name"].endswith("-test-ready")]
        assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
        assert pod["spec"]["nodeSelector"] == {"pool": "ops"}  # where the operator runs
        args = pod["spec"]["containers"][0]["args"]
        assert args[:2] == ["operator", "ready"]
        # The kubelet's variables of the operator's Service (enableServiceLinks), not DNS.
        (service,) = by_kind(docs, "Service")
        assert service["metadata"]["name"] == name
        assert {"name": "liveness", "port": 8080, "targetPort": "liveness"} in service["spec"]["ports"]
        service["spec"]["clusterIP"] = "127.96.7.8"
        env = services.service_env([services.parse_service(service)], "strata-system")
        assert "--url=http://127.96.7.8:8080/healthz" in [envs.expand(a, env) for a in args]
        assert pod["spec"]["enableServiceLinks"] is True
        # The test pod is not one of the operator's pods.
        assert pod["metadata"]["labels"]["app.kubernetes.io/name"] != "strata-operator"


def test_two_replicas_use_peering_with_random_priorities():
    (deployment,) = by_kind(render(), "Deployment")
    assert deployment["spec"]["replicas"] == 2
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--peering=strata-strata-system" in args and "--priority=auto" in args
    assert by_kind(render(), "ClusterKopfPeering")[0]["metadata"]["name"] == "strata-strata-system"


def test_one_replica_runs_standalone():
    (deployment,) = by_kind(render("operator.replicas=1"), "Deployment")
    assert "--standalone" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]


def test_default_tiers_are_installed_behind_a_toggle():
    tiers = {t["metadata"]["name"] for t in by_kind(render(), "ServiceTier")}
    assert tiers == {p.stem for p in (CHART / "files" / "servicetiers").glob("*.yaml")}
    assert by_kind(render("serviceTiers.install=false"), "ServiceTier") == []


def test_rbac_grants_no_wildcards_no_secrets_and_no_gets_of_what_is_watched():
    (role,) = [r for r in by_kind(render(), "ClusterRole") if r["metadata"]["name"] == "strata-strata-system"]
    for rule in role["rules"]:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"]
        assert "secrets" not in rule["resources"]
        assert not {"update", "deletecollection", "escalate", "bind", "impersonate"} & set(rule["verbs"])
    # Reads come from the watches' caches: nothing is fetched one object at a time.
    reads = {r: set(rule["verbs"]) for rule in role["rules"] for r in rule["resources"]}
    for resource in (
        "inferenceservices",
        "servicetiers",
        "deployments",
        "statefulsets",
        "configmaps",
        "pods",
    ):
        assert "get" not in reads[resource] and {"list", "watch"} <= reads[resource], resource
    (binding,) = [
        b for b in by_kind(render(), "ClusterRoleBinding") if b["metadata"]["name"] == "strata-strata-system"
    ]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "strata", "namespace": "strata-system"}]


def test_operator_pod_is_hardened_and_probed():
    (deployment,) = by_kind(render(), "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert pod["securityContext"]["runAsNonRoot"] and container["securityContext"]["readOnlyRootFilesystem"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["STRATA_NVME_VOLUME"] == "ephemeral"
    (other,) = by_kind(render("worker.nvmeVolume=hostPath"), "Deployment")
    assert {"name": "STRATA_NVME_VOLUME", "value": "hostPath"} in other["spec"]["template"]["spec"][
        "containers"
    ][0]["env"]
    # Both servers on the pod IP (defined before it is used), never 0.0.0.0: on the test
    # cluster's local pod runtime pods share the host's ports, and Service ClusterIPs too.
    assert container["env"][0] == {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
    assert env["STRATA_METRICS_HOST"] == "$(POD_IP)"
    assert "--liveness=http://$(POD_IP):8080/healthz" in container["args"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/healthz"


def test_crds_apply_upgrades_an_older_crd_under_the_hooks_rbac(cluster: Cluster, namespace: str) -> None:
    """What the pre-upgrade hook Job runs, run here as a process with its ServiceAccount's token
    (KWOK runs no containers): an older ServiceTier CRD is brought up to this version's."""
    rendered = helm(
        "template",
        "obs",
        str(CHART),
        "-n",
        namespace,
        "--kube-version",
        KUBE_VERSION,
        "--show-only",
        "templates/crds-upgrade.yaml",
    )
    rbac = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] != "Job"]
    cluster.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": rbac}))
    try:
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
        current = apply_older_servicetier_crd(cluster)
        kubeconfig = cluster.service_account_kubeconfig(namespace, "obs-strata-crds-upgrade")
        done = subprocess.run(
            [sys.executable, "-m", "strata", "crds", "apply", "--kubeconfig", str(kubeconfig)],
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        assert done.returncode == 0, done.stderr
        assert "servicetiers.strata.dev: configured" in done.stdout
        assert printer_columns(cluster) == printer_columns_of(current)
        # The hook's ServiceAccount can touch nothing but Strata's CRDs.
        denied = cluster.kubectl(
            "auth",
            "can-i",
            "patch",
            "customresourcedefinitions/clusterkopfpeerings.kopf.dev",
            user_kubeconfig=kubeconfig,
            check=False,
        )
        assert denied.stdout.strip() == "no"
    finally:
        cluster.kubectl(
            "delete",
            "clusterrole,clusterrolebinding",
            f"obs-strata-{namespace}-crds-upgrade",
            "--ignore-not-found",
        )


def printer_columns_of(crd: dict[str, Any]) -> list[str]:
    return [c["name"] for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]]


def printer_columns(cluster: Cluster) -> list[str]:
    return printer_columns_of(cluster.kubectl_json("get", "crd", "servicetiers.strata.dev", "-o", "json"))


def apply_older_servicetier_crd(cluster: Cluster) -> dict[str, Any]:
    """Apply the ServiceTier CRD of an older chart version (without this version's last printer
    column, "Age"); returns this version's."""
    current = next(
        c
        for c in generate.crds()
        if c["kind"] == "CustomResourceDefinition" and "servicetiers" in c["metadata"]["name"]
    )
    older = json.loads(json.dumps(current))
    older["spec"]["versions"][0]["additionalPrinterColumns"].pop()
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(older))
    assert printer_columns(cluster) == printer_columns_of(older)
    return current


CLUSTER_SCOPED = {
    "ClusterRole",
    "ClusterRoleBinding",
    "ClusterKopfPeering",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "ServiceTier",
}
# What a second release in the same cluster leaves to the first (one per cluster).
SECOND_RELEASE = (
    "admissionPolicy.install=false",
    "serviceTiers.install=false",
    "crds.upgrade=false",
    "operator.replicas=1",
)


def cluster_scoped(docs: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {(d["kind"], d["metadata"]["name"]) for d in docs if d["kind"] in CLUSTER_SCOPED}


def test_a_second_release_of_the_same_name_shares_no_cluster_scoped_name() -> None:
    def release(namespace: str, *sets: str) -> list[dict[str, Any]]:
        argv = ["template", "strata", str(CHART), "-n", namespace, "--kube-version", KUBE_VERSION]
        for s in ("crds.upgrade=true", *sets):  # the hook's ClusterRole too
            argv += ["--set", s]
        return [d for d in yaml.safe_load_all(helm(*argv)) if d]

    first = cluster_scoped(release("team-a", "operator.watchNamespaces={a1,a2}", "operator.replicas=1"))
    second = cluster_scoped(release("team-b", *SECOND_RELEASE, "operator.watchNamespaces={b1}"))
    assert ("ClusterRole", "strata-team-a") in first and ("ClusterRole", "strata-team-b") in second
    assert first.isdisjoint(second)
    # Hook objects (rendered only on upgrade) are cluster-scoped too.
    hooks = [d for d in release("team-b") if d["kind"] == "ClusterRole"]
    assert {h["metadata"]["name"] for h in hooks} == {"strata-team-b", "strata-team-b-crds-upgrade"}
    assert {kind for kind, _ in second} == {"ClusterRole", "ClusterRoleBinding"}


def test_watch_namespaces_limit_the_operator_and_its_pod_monitors() -> None:
    argv = ["template", "strata", str(CHART), "-n", "team-b", "--kube-version", KUBE_VERSION]
    argv += ["--api-versions", "monitoring.coreos.com/v1/PodMonitor"]
    argv += ["--set", "operator.replicas=1", "--set", "operator.watchNamespaces={b1,b2}"]
    docs = [d for d in yaml.safe_load_all(helm(*argv)) if d]
    (deployment,) = by_kind(docs, "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--standalone" in args and args[-2:] == ["--namespace=b1", "--namespace=b2"]
    monitors = by_kind(docs, "PodMonitor")
    assert len(monitors) == 2
    assert all(m["spec"]["namespaceSelector"] == {"matchNames": ["b1", "b2"]} for m in monitors)
    # Cluster-wide (the default): every namespace.
    default = [d for d in yaml.safe_load_all(helm(*argv[:-4])) if d]
    assert all(m["spec"]["namespaceSelector"] == {"any": True} for m in by_kind(default, "PodMonitor"))


def test_watch_namespaces_with_peered_replicas_are_refused_naming_the_value() -> None:
    error = template_error("operator.watchNamespaces={b1}")  # two replicas, peering on
    assert "operator.watchNamespaces" in error and "operator.replicas=1" in error
    assert "operator/watchNamespaces" in template_error("operator.watchNamespaces={Bad_Name}")
