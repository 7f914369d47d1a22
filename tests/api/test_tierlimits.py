"""check_against_tier: the operator's copy of the admission policy's cross-object rules."""

from __future__ import annotations

from typing import Any

import pytest

from strata.operator.api import InferenceServiceSpec, ServiceTierSpec, check_against_tier

TIER = ServiceTierSpec.model_validate(
    {
        "cache": {
            "dram": {"defaultSize": "8Gi", "maxSize": "64Gi"},
            "nvme": {"defaultSize": "100Gi", "maxSize": "500Gi"},
            "shared": {"enabled": False},
        },
        "autoscaling": {"minReplicas": 1, "maxReplicas": 8},
        "limits": {"maxGpusPerReplica": 4, "maxGpusPerService": 16},
    }
)


def spec(**fields: Any) -> InferenceServiceSpec:
    return InferenceServiceSpec.model_validate(
        {"model": {"name": "m", "source": {"builtin": "tiny"}}, **fields}
    )


def test_a_service_within_every_limit_fits() -> None:
    fitting = spec(
        cache={"dram": "64Gi", "nvme": "500Gi"}, resources={"gpus": 4}, minReplicas=1, maxReplicas=4
    )
    assert check_against_tier(fitting, TIER) == []


def test_unset_cache_sizes_use_the_tier_default_and_always_fit() -> None:
    assert check_against_tier(spec(), TIER) == []


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        (
            {"cache": {"dram": "65Gi"}},
            "spec.cache.dram",
            "65Gi exceeds ServiceTier standard cache.dram.maxSize 64Gi",
        ),
        ({"cache": {"dram": 68719476737}}, "spec.cache.dram", "exceeds"),  # 64Gi + 1 byte, as an integer
        ({"cache": {"nvme": "501Gi"}}, "spec.cache.nvme", "cache.nvme.maxSize 500Gi"),
        ({"cache": {"nvme": "1T"}}, "spec.cache.nvme", "1T exceeds"),  # 1e12 > 500 * 2**30
        ({"cache": {"shared": True}}, "spec.cache.shared", "does not enable the shared tier"),
        (
            {"resources": {"gpus": 5}},
            "spec.resources.gpus",
            "5 exceeds ServiceTier standard limits.maxGpusPerReplica 4",
        ),
        (
            {"resources": {"gpus": 4}, "maxReplicas": 5},
            "spec.maxReplicas",
            "5 replicas x 4 GPUs exceeds ServiceTier standard limits.maxGpusPerService 16",
        ),
        ({"maxReplicas": 9}, "spec.maxReplicas", "9 exceeds ServiceTier standard autoscaling.maxReplicas 8"),
        ({"minReplicas": 0}, "spec.minReplicas", "0 is below ServiceTier standard autoscaling.minReplicas 1"),
    ],
)
def test_each_limit_names_the_field_and_the_tier(fields: dict[str, Any], field: str, message: str) -> None:
    violations = check_against_tier(spec(**fields), TIER)
    assert [v.field for v in violations] == [field]
    assert message in violations[0].message


def test_scale_to_zero_needs_a_tier_whose_minimum_is_zero() -> None:
    assert [v.field for v in check_against_tier(spec(minReplicas=0), TIER)] == ["spec.minReplicas"]
    zero = TIER.autoscaling.model_copy(update={"min_replicas": 0, "scale_to_zero": True})
    assert check_against_tier(spec(minReplicas=0), TIER.model_copy(update={"autoscaling": zero})) == []


def test_every_violation_is_reported_at_once_and_the_tier_name_can_be_given() -> None:
    greedy = spec(
        cache={"dram": "1Ti", "shared": True}, resources={"gpus": 8}, maxReplicas=100, minReplicas=0
    )
    violations = check_against_tier(greedy, TIER, tier_name="gold")
    fields = [v.field for v in violations]
    assert fields == [
        "spec.cache.dram",
        "spec.cache.shared",
        "spec.resources.gpus",
        "spec.maxReplicas",
        "spec.maxReplicas",
        "spec.minReplicas",
    ]
    assert all("ServiceTier gold" in v.message for v in violations)
    assert str(violations[0]).startswith("spec.cache.dram: 1Ti exceeds")
