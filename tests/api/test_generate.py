"""Generated CRDs, policy and docs: deterministic, current, structural, documented."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from strata.operator.api import generate
from strata.operator.api.cli import main
from strata.operator.api.crds import inference_service_crd, service_tier_crd
from strata.operator.api.models import InferenceServiceSpec
from strata.operator.api.policy import Expr, admission_policy, message
from strata.operator.api.schema import SchemaError, structural_schema

ROOT = generate.REPO_ROOT


def test_generation_is_deterministic() -> None:
    assert generate.rendered(ROOT) == generate.rendered(ROOT)
    assert generate.crd_files() == generate.crd_files()


def test_committed_files_match_the_models() -> None:
    stale = generate.diff(ROOT)
    assert stale == [], "generated API files are stale; run `make crds`:\n" + "".join(stale[:40])


def test_chart_copies_match(tmp_path: Path) -> None:
    files = generate.rendered(ROOT)
    for name, text in generate.crd_files().items():
        if name == generate.POLICY_FILE:  # the same objects, behind admissionPolicy.install
            assert files[generate.CHART_POLICY] == generate.chart_policy(text)
        else:
            assert files[generate.CHART_CRDS / name] == text
    # The policy is a template (Helm upgrades it); only CRDs are in the chart's crds/.
    assert not (ROOT / generate.CHART_CRDS / generate.POLICY_FILE).exists()
    tiers = sorted(p.name for p in (ROOT / generate.EXAMPLE_TIERS).glob("*.yaml"))
    assert (
        sorted(p.name for p in files if p.parent == generate.CHART_TIERS)
        == tiers
        == [
            "batch.yaml",
            "premium.yaml",
            "standard.yaml",
        ]
    )


def test_check_fails_with_a_diff_when_a_file_is_stale(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    assert main(["generate", "--root", str(tmp_path)]) == 0
    assert main(["check", "--root", str(tmp_path)]) == 0
    crd = tmp_path / "crds" / "strata.dev_servicetiers.yaml"
    crd.write_text(crd.read_text().replace("- stier", "- tier"))
    capsys.readouterr()
    assert main(["check", "--root", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "-    - tier" in out and "+    - stier" in out


def walk(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found: list[tuple[str, dict[str, Any]]] = []
    if isinstance(node, dict):
        found.append((path, node))
        for key, child in node.items():
            found += walk(child, f"{path}/{key}")
    elif isinstance(node, list):
        for i, child in enumerate(node):
            found += walk(child, f"{path}/{i}")
    return found


@pytest.mark.parametrize("crd", [inference_service_crd(), service_tier_crd()], ids=["isvc", "tier"])
def test_schemas_are_structural_and_every_field_is_described(crd: dict[str, Any]) -> None:
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in walk(schema):
        assert "$ref" not in node and "title" not in node and "const" not in node, path
        assert node.get("additionalProperties") is not False, path
        if "anyOf" in node:
            assert node.get("x-kubernetes-int-or-string") is True, path
        if not isinstance(exclusive := node.get("exclusiveMinimum", True), bool):
            pytest.fail(f"{path}: exclusiveMinimum must be boolean in OpenAPI v3.0, got {exclusive}")
        if path.endswith("/properties"):
            continue  # the map of field names, not a schema
        for name, prop in node.get("properties", {}).items():
            if name != "metadata":
                assert prop.get("description"), f"{path}/properties/{name} has no description"


def test_quantities_are_int_or_string_with_a_pattern() -> None:
    spec = inference_service_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    dram = spec["properties"]["cache"]["properties"]["dram"]
    assert dram["x-kubernetes-int-or-string"] is True
    assert dram["anyOf"] == [{"type": "integer"}, {"type": "string"}]
    assert dram["pattern"].startswith("^")


def test_sections_with_defaults_default_to_their_fields_defaults() -> None:
    spec = structural_schema(InferenceServiceSpec)
    assert spec["properties"]["engine"]["default"] == {
        "kind": "torch",
        "blockSize": 16,
        "maxNumSeqs": 64,
        "maxBatchedTokens": 2048,
    }
    assert "default" not in spec["properties"]["model"]  # required, never defaulted
    assert spec["required"] == ["model"]


def test_scale_subresource_printer_columns_and_names() -> None:
    version = inference_service_crd()["spec"]["versions"][0]
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    assert [c["name"] for c in version["additionalPrinterColumns"]][:7] == [
        "Tier",
        "Model",
        "Ready",
        "Desired",
        "KV",
        "TTFT-P95-MS",
        "Age",
    ]
    names = inference_service_crd()["spec"]["names"]
    assert names["shortNames"] == ["infsvc"] and names["categories"] == ["strata"]


def test_every_policy_rule_first_checks_that_the_tier_is_its_parameter() -> None:
    policy = admission_policy()["spec"]
    assert policy["variables"] == [
        {"name": "myTier", "expression": "object.spec.tier == params.metadata.name"}
    ]
    for validation in policy["validations"]:
        assert validation["expression"].startswith("!variables.myTier || (")
        assert validation["messageExpression"].startswith("'spec.")


def test_messages_quote_literal_text_for_cel() -> None:
    assert message("it's ", Expr("x.y"), " a\\b") == "'it\\'s ' + string(x.y) + ' a\\\\b'"


def test_a_union_that_is_not_structural_is_refused() -> None:
    from pydantic import BaseModel, Field

    class Bad(BaseModel):
        value: int | str = Field(description="either")

    with pytest.raises(SchemaError, match="not structural"):
        structural_schema(Bad)


def test_a_field_without_description_is_refused() -> None:
    from pydantic import BaseModel

    class Undocumented(BaseModel):
        value: int = 0

    with pytest.raises(SchemaError, match="needs a description"):
        structural_schema(Undocumented)
