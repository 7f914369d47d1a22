"""The generated CRDs and admission policy, against a real kube-apiserver.

One module-scoped install (CRDs, policy, the example tiers), then each check is one API call
through the Python client, so the whole corpus of invalid manifests runs in seconds.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from strata.operator.api import (
    InferenceService,
    InferenceServiceSpec,
    ServiceTier,
    ServiceTierSpec,
    check_against_tier,
    to_manifest,
)
from tests.api.invalid_cases import CASES, Case, merged

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
GROUP, VERSION = "strata.dev", "v1alpha1"
FIELD_MANAGER = "strata-api-tests"
POLICY_FILE = "strata.dev_tier-limits-policy.yaml"
POLICY_READY_TIMEOUT_S = 120.0


def example(path: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "examples" / path).read_text())
    return data


STANDARD = example("servicetiers/standard.yaml")
BASE_SERVICE = {"model": {"name": "m", "source": {"builtin": "tiny"}}}


class Api:
    """The custom-objects client, with the test's namespace and unique names."""

    def __init__(self, api_client: client.ApiClient, namespace: str) -> None:
        self.objects = client.CustomObjectsApi(api_client)
        self.namespace = namespace
        self.tiers: list[str] = []  # cluster-scoped: deleted at the end, unlike the namespace's objects

    def create_service(self, spec: dict[str, Any], name: str | None = None, dry_run: bool = False) -> Any:
        body: dict[str, Any] = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "InferenceService",
            "metadata": {"name": name or unique()},
        }
        return self.objects.create_namespaced_custom_object(
            GROUP,
            VERSION,
            self.namespace,
            "inferenceservices",
            {**body, "spec": spec},
            dry_run="All" if dry_run else None,
            field_validation="Strict",
        )

    def create_tier(self, spec: dict[str, Any], name: str | None = None, dry_run: bool = False) -> Any:
        body: dict[str, Any] = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "ServiceTier",
            "metadata": {"name": name or unique()},
        }
        if not dry_run:
            self.tiers.append(body["metadata"]["name"])
        return self.objects.create_cluster_custom_object(
            GROUP,
            VERSION,
            "servicetiers",
            {**body, "spec": spec},
            dry_run="All" if dry_run else None,
            field_validation="Strict",
        )

    def replace(self, obj: dict[str, Any], spec: dict[str, Any]) -> Any:
        body = {**obj, "spec": spec}
        name = obj["metadata"]["name"]
        if obj["kind"] == "ServiceTier":
            return self.objects.replace_cluster_custom_object(GROUP, VERSION, "servicetiers", name, body)
        return self.objects.replace_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "inferenceservices", name, body
        )

    def get_service(self, name: str) -> Any:
        return self.objects.get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "inferenceservices", name
        )

    def patch_service(self, name: str, patch: dict[str, Any], status: bool = False) -> Any:
        patcher = (
            self.objects.patch_namespaced_custom_object_status
            if status
            else self.objects.patch_namespaced_custom_object
        )
        return patcher(GROUP, VERSION, self.namespace, "inferenceservices", name, patch)


def unique() -> str:
    return f"t-{uuid.uuid4().hex[:8]}"


def error_text(error: ApiException) -> str:
    try:
        body = json.loads(error.body or "")
    except (TypeError, ValueError):
        return str(error.body)
    return f"{body.get('message', '')} {json.dumps(body.get('details', {}))}"


@pytest.fixture(scope="module")
def api(cluster: Any) -> Iterator[Api]:
    """CRDs, policy and the example tiers installed; a namespace of this module's own."""
    cluster.kubectl(
        "apply",
        "--server-side",
        "--force-conflicts",
        f"--field-manager={FIELD_MANAGER}",
        "-f",
        str(ROOT / "crds"),
    )
    cluster.kubectl(
        "wait",
        "--for=condition=Established",
        "crd/inferenceservices.strata.dev",
        "crd/servicetiers.strata.dev",
    )
    cluster.kubectl(
        "apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "examples" / "servicetiers")
    )
    namespace = unique()
    cluster.kubectl("create", "namespace", namespace)
    api_client = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    handle = Api(api_client, namespace)
    wait_for_policy(handle)
    try:
        yield handle
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        for tier in handle.tiers:
            cluster.kubectl("delete", "servicetier", tier, "--wait=false", check=False)
        api_client.close()
        # Leave the session's cluster as found: the chart installed by later tests owns the example tiers'
        # names and the policy, and helm refuses to adopt objects it did not create.
        for applied in (ROOT / "examples" / "servicetiers", ROOT / "crds" / POLICY_FILE):
            cluster.kubectl("delete", "--ignore-not-found", "--timeout=120s", "-f", str(applied), check=False)


def wait_for_policy(api: Api) -> None:
    """The policy starts working once the API server has discovered its parameter kind."""
    deadline = time.monotonic() + POLICY_READY_TIMEOUT_S
    over = merged(BASE_SERVICE, {"cache": {"dram": "1Ei"}})
    last = ""
    while time.monotonic() < deadline:
        try:
            api.create_service(over, dry_run=True)
            last = "admitted"
        except ApiException as error:
            last = error_text(error)
            if "exceeds ServiceTier standard" in last:
                return
        time.sleep(1)
    pytest.fail(f"the tier-limit admission policy did not take effect: {last}")


# ----------------------------------------------------------------------------- accepted and defaulted


@pytest.mark.parametrize("name", ["minimal", "full", "gated", "vllm-8b", "vllm-70b-tp4"])
def test_example_services_are_accepted_and_defaulted_as_the_models_say(api: Api, name: str) -> None:
    manifest = example(f"inferenceservices/{name}.yaml")
    created = api.create_service(manifest["spec"], name=f"{name}-{unique()}")
    expected = to_manifest(InferenceServiceSpec.model_validate(manifest["spec"]))
    assert created["spec"] == expected


@pytest.mark.parametrize("name", ["premium", "standard", "batch"])
def test_example_tiers_are_accepted_and_defaulted_as_the_models_say(api: Api, name: str) -> None:
    manifest = example(f"servicetiers/{name}.yaml")
    created = api.create_tier(manifest["spec"], dry_run=True)
    assert created["spec"] == to_manifest(ServiceTierSpec.model_validate(manifest["spec"]))


def test_an_empty_tier_gets_every_documented_default(api: Api) -> None:
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ServiceTier", "metadata": {"name": unique()}}
    created: Any = api.objects.create_cluster_custom_object(
        GROUP, VERSION, "servicetiers", body, dry_run="All"
    )
    assert created["spec"] == to_manifest(ServiceTierSpec())


def test_a_service_in_a_tier_that_does_not_exist_is_admitted_for_the_operator_to_report(api: Api) -> None:
    created = api.create_service(
        merged(BASE_SERVICE, {"tier": "no-such-tier", "cache": {"dram": "1Ei"}}), dry_run=True
    )
    assert created["spec"]["tier"] == "no-such-tier"


# ----------------------------------------------------------------------------- the invalid corpus


def test_the_corpus_is_large_and_covers_every_kind_of_mistake() -> None:
    assert len(CASES) >= 40
    assert {case.offline for case in CASES} == {"model", "tier", "none"}
    assert len({case.name + case.kind for case in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda case: f"{case.kind}-{case.name}")
def test_invalid_manifest_is_rejected_naming_the_field(api: Api, case: Case) -> None:
    base = BASE_SERVICE if case.kind == "InferenceService" else STANDARD["spec"]
    spec = merged(base, case.change)
    with pytest.raises(ApiException) as raised:
        if case.before is None:
            create(api, case.kind, spec, dry_run=True, name=case.object_name)
        else:
            api.replace(create(api, case.kind, merged(base, case.before)), spec)
    # 422 Invalid; an unknown field fails strict decoding before validation, with 400.
    assert raised.value.status in (400, 422), error_text(raised.value)
    message = error_text(raised.value)
    assert case.field in message, message
    check_offline(case, spec, message)


def create(api: Api, kind: str, spec: dict[str, Any], dry_run: bool = False, name: str | None = None) -> Any:
    if kind == "ServiceTier":
        return api.create_tier(spec, name=name, dry_run=dry_run)
    return api.create_service(spec, name=name, dry_run=dry_run)


def check_offline(case: Case, spec: dict[str, Any], server_message: str) -> None:
    """The operator's offline checks refuse the same manifest, for the same field."""
    if case.offline == "tier":
        violations = check_against_tier(
            InferenceServiceSpec.model_validate(spec), ServiceTierSpec.model_validate(STANDARD["spec"])
        )
        assert case.field in [v.field for v in violations]
        assert str(violations[0]) in server_message  # same rule, same words as the policy
    elif case.object_name is not None:
        model = InferenceService if case.kind == "InferenceService" else ServiceTier
        with pytest.raises(ValidationError, match=r"metadata\.name"):
            model.model_validate({"metadata": {"name": case.object_name}, "spec": spec})
    elif case.offline == "model":
        spec_model = InferenceServiceSpec if case.kind == "InferenceService" else ServiceTierSpec
        with pytest.raises(ValidationError) as raised:
            spec_model.model_validate(spec)
        assert any(names_field(error, case.field) for error in raised.value.errors()), raised.value


def names_field(error: Any, field: str) -> bool:
    path = ".".join(["spec", *map(str, error["loc"])])
    located = path == field or (
        path != "spec" and (path.startswith(f"{field}.") or field.startswith(f"{path}."))
    )
    return located or field in str(error["msg"])


# ----------------------------------------------------------------------------- subresources


def test_status_is_written_only_through_the_status_subresource(api: Api) -> None:
    name = api.create_service(BASE_SERVICE)["metadata"]["name"]
    status = {"replicas": 2, "readyReplicas": 1, "desiredReplicas": 2, "endpoint": "http://x:8000"}

    after_main = api.patch_service(name, {"status": status})
    assert "status" not in after_main, "the main resource must ignore status"

    after_status = api.patch_service(name, {"status": status, "spec": {"replicas": 5}}, status=True)
    assert after_status["status"] == status
    assert after_status["spec"]["replicas"] == 1, "the status subresource must ignore spec"

    with pytest.raises(ApiException) as raised:
        api.patch_service(name, {"status": {"signals": {"kvCacheUsage": 2}}}, status=True)
    assert "status.signals.kvCacheUsage" in error_text(raised.value)


def test_kubectl_scale_sets_the_desired_replicas_and_scale_reports_the_selector(
    api: Api, cluster: Any
) -> None:
    name = api.create_service(merged(BASE_SERVICE, {"maxReplicas": 4}))["metadata"]["name"]
    api.patch_service(
        name, {"status": {"replicas": 1, "selector": f"strata.dev/service={name}"}}, status=True
    )

    cluster.kubectl("scale", f"infsvc/{name}", "--replicas=3", "-n", api.namespace)

    assert api.get_service(name)["spec"]["replicas"] == 3
    scale: Any = api.objects.get_namespaced_custom_object_scale(
        GROUP, VERSION, api.namespace, "inferenceservices", name
    )
    assert scale["spec"]["replicas"] == 3
    assert scale["status"] == {"replicas": 1, "selector": f"strata.dev/service={name}"}


def test_kubectl_get_shows_the_printer_columns_and_explain_the_descriptions(api: Api, cluster: Any) -> None:
    name = api.create_service(BASE_SERVICE)["metadata"]["name"]
    api.patch_service(
        name,
        {
            "status": {
                "readyReplicas": 1,
                "desiredReplicas": 1,
                "signals": {"kvCacheUsage": 0.42, "ttftP95Ms": 180},
            }
        },
        status=True,
    )
    table = cluster.kubectl("get", "infsvc", "-n", api.namespace).stdout
    assert table.split("\n")[0].split() == [
        "NAME",
        "TIER",
        "MODEL",
        "READY",
        "DESIRED",
        "KV",
        "TTFT-P95-MS",
        "AGE",
    ]
    row = next(line for line in table.splitlines() if name in line).split()
    assert row[1:7] == ["standard", "m", "1", "1", "0.42", "180"]

    explained = cluster.kubectl("explain", "infsvc.spec.cache.dram").stdout
    assert "Host-DRAM KV tier per replica (bytes; quantity)" in explained


def test_the_policy_checks_each_service_against_its_own_tier_on_create_and_update(api: Api) -> None:
    big_dram = {"cache": {"dram": "100Gi"}}  # over standard's 64Gi, within premium's 128Gi
    created = api.create_service(merged(BASE_SERVICE, {"tier": "premium", **big_dram}))
    name = created["metadata"]["name"]
    with pytest.raises(ApiException) as raised:
        api.patch_service(name, {"spec": {"tier": "standard"}})
    assert "spec.cache.dram: 100Gi exceeds ServiceTier standard cache.dram.maxSize 64Gi" in error_text(
        raised.value
    )
    assert api.get_service(name)["spec"]["tier"] == "premium"
