"""The Helm chart: lints, renders the operator with peering, and the RBAC the operator needs."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from strata.cluster.binaries import find_bin_dir

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "strata"

pytestmark = pytest.mark.cluster  # needs bin/helm from `make cluster-bins`


def helm(*args: str) -> str:
    return subprocess.run(
        [str(find_bin_dir() / "helm"), *args], capture_output=True, text=True, check=True
    ).stdout


def render(*sets: str) -> list[dict[str, Any]]:
    argv = ["template", "strata", str(CHART), "-n", "strata-system"]
    for s in sets:
        argv += ["--set", s]
    return [d for d in yaml.safe_load_all(helm(*argv)) if d]


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def test_chart_lints():
    assert "0 chart(s) failed" in helm("lint", str(CHART))


def test_two_replicas_use_peering_with_random_priorities():
    (deployment,) = by_kind(render(), "Deployment")
    assert deployment["spec"]["replicas"] == 2
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--peering=strata" in args and "--priority=auto" in args
    assert by_kind(render(), "ClusterKopfPeering")[0]["metadata"]["name"] == "strata"


def test_one_replica_runs_standalone():
    (deployment,) = by_kind(render("operator.replicas=1"), "Deployment")
    assert "--standalone" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]


def test_default_tiers_are_installed_behind_a_toggle():
    tiers = {t["metadata"]["name"] for t in by_kind(render(), "ServiceTier")}
    assert tiers == {p.stem for p in (CHART / "files" / "servicetiers").glob("*.yaml")}
    assert by_kind(render("serviceTiers.install=false"), "ServiceTier") == []


def test_rbac_grants_no_wildcards_no_secrets_and_no_gets_of_what_is_watched():
    (role,) = by_kind(render(), "ClusterRole")
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
    (binding,) = by_kind(render(), "ClusterRoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "strata", "namespace": "strata-system"}]


def test_operator_pod_is_hardened_and_probed():
    (deployment,) = by_kind(render(), "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert pod["securityContext"]["runAsNonRoot"] and container["securityContext"]["readOnlyRootFilesystem"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["STRATA_NVME_VOLUME"] == "ephemeral"
    assert by_kind(render("worker.nvmeVolume=hostPath"), "Deployment")[0]["spec"]["template"]["spec"][
        "containers"
    ][0]["env"][2] == {"name": "STRATA_NVME_VOLUME", "value": "hostPath"}
