"""The pydantic models: examples parse, defaults are the documented ones, bad input names its field."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from strata.operator.api import (
    InferenceService,
    InferenceServiceSpec,
    InferenceServiceStatus,
    ServiceTier,
    ServiceTierSpec,
    check_against_tier,
    parse_size,
    to_manifest,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(path.read_text())
    return data


def tiers() -> dict[str, ServiceTier]:
    parsed = [ServiceTier.model_validate(load(p)) for p in sorted((EXAMPLES / "servicetiers").glob("*.yaml"))]
    return {tier.metadata["name"]: tier for tier in parsed}


def test_the_three_default_tiers_parse_and_are_ordered_by_priority_and_latency() -> None:
    by_name = tiers()
    assert sorted(by_name) == ["batch", "premium", "standard"]
    premium, standard, batch = (by_name[n].spec for n in ("premium", "standard", "batch"))
    assert premium.priority > standard.priority > batch.priority
    assert premium.slo.ttft_p95_ms < standard.slo.ttft_p95_ms < batch.slo.ttft_p95_ms
    assert premium.cache.nvme.survives_restart and not standard.cache.nvme.survives_restart
    assert [t.autoscaling.scale_to_zero for t in (premium, standard, batch)] == [False, False, True]


@pytest.mark.parametrize("name", ["minimal", "full", "gated", "vllm-8b", "vllm-70b-tp4"])
def test_example_services_parse_and_fit_their_tier(name: str) -> None:
    service = InferenceService.model_validate(load(EXAMPLES / "inferenceservices" / f"{name}.yaml"))
    tier = tiers()[service.spec.tier]
    assert check_against_tier(service.spec, tier.spec) == []


def test_minimal_service_gets_the_documented_defaults() -> None:
    spec = InferenceService.model_validate(load(EXAMPLES / "inferenceservices" / "minimal.yaml")).spec
    assert to_manifest(spec) == {
        "tier": "standard",
        "model": {
            "name": "tiny",
            "source": {"builtin": "tiny"},
            "dtype": "bfloat16",
            "maxContextTokens": 4096,
        },
        "engine": {"kind": "torch", "blockSize": 16, "maxNumSeqs": 64, "maxBatchedTokens": 2048},
        "resources": {"gpus": 1, "cpu": "4", "memory": "32Gi"},
        "replicas": 1,
        "minReplicas": 1,
        "maxReplicas": 1,
        "autoscaling": {"mode": "builtin"},
        "cache": {"shared": False},
    }


def test_snake_case_and_camel_case_both_populate_and_the_wire_form_is_camel_case() -> None:
    by_alias = InferenceServiceSpec.model_validate({"model": {"name": "m", "source": {"uri": "hf://org/m"}}})
    by_name = InferenceServiceSpec(model={"name": "m", "source": {"uri": "hf://org/m"}}, min_replicas=1)  # type: ignore[arg-type]
    assert by_alias == by_name
    assert "minReplicas" in to_manifest(by_name)


def test_sizes_keep_the_tenants_spelling_and_integers_become_strings() -> None:
    spec = InferenceServiceSpec.model_validate(
        {
            "model": {"name": "m", "source": {"builtin": "tiny"}},
            "cache": {"dram": 1073741824, "nvme": "1.5Ti"},
        }
    )
    assert (spec.cache.dram, spec.cache.nvme) == ("1073741824", "1.5Ti")
    assert spec.cache.nvme is not None and parse_size(spec.cache.nvme) == 3 * 2**39


def test_status_tolerates_unknown_fields_and_parses_timestamps() -> None:
    status = InferenceServiceStatus.model_validate(
        {
            "observedGeneration": 3,
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-02T03:04:05Z"}],
            "signals": {"kvCacheUsage": 0.5, "prefixHitRatio": {"dram": 0.25}},
            "fieldFromTheFuture": 1,
        }
    )
    assert status.conditions[0].last_transition_time is not None
    assert status.signals is not None and status.signals.prefix_hit_ratio is not None
    assert status.signals.prefix_hit_ratio.dram == 0.25


BASE = {"model": {"name": "m", "source": {"builtin": "tiny"}}}


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"model": {"name": "m", "source": {}}}, "exactly one of pvc, uri, builtin"),
        ({"model": {"name": "m", "source": {"builtin": "tiny", "uri": "s3://b/m"}}}, "exactly one"),
        ({"minReplicas": 3, "maxReplicas": 2}, "spec.minReplicas (3) must not exceed spec.maxReplicas (2)"),
        ({"cache": {"dram": "8GB"}}, "'8GB' is not a quantity"),
        ({"cache": {"nvme": "500m"}}, "milli"),
        ({"resources": {"cpu": "0"}}, "must be positive"),
        ({"resources": {"gpus": "2"}}, "valid integer"),  # strict: no silent coercion
        ({"cache": {"shared": "yes"}}, "valid boolean"),
        ({"gpu": 1}, "Extra inputs are not permitted"),
    ],
)
def test_invalid_service_specs_are_refused_offline(fields: dict[str, Any], expected: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(expected)):
        InferenceServiceSpec.model_validate({**BASE, **fields})


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        (
            {"cache": {"dram": {"defaultSize": "2Gi", "maxSize": "1Gi"}}},
            "defaultSize (2Gi) must not exceed maxSize",
        ),
        ({"autoscaling": {"minReplicas": 0}}, "only with spec.autoscaling.scaleToZero"),
        (
            {"autoscaling": {"minReplicas": 5, "maxReplicas": 4}},
            "must not exceed spec.autoscaling.maxReplicas",
        ),
        ({"limits": {"maxGpusPerReplica": 8, "maxGpusPerService": 4}}, "maxGpusPerReplica must not exceed"),
        (
            {"routing": {"holdTimeoutSeconds": 0}},
            "routing.holdTimeoutSeconds\n  Input should be greater than or equal to 1",
        ),
        (
            {"routing": {"holdMaxRequests": -1}},
            "routing.holdMaxRequests\n  Input should be greater than or equal to 0",
        ),
    ],
)
def test_invalid_tiers_are_refused_offline(fields: dict[str, Any], expected: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(expected)):
        ServiceTierSpec.model_validate(fields)
