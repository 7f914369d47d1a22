"""Cost per tenant and tier (pure): usage over time, footprints from real tiers, status merges."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from strata.operator.autoscale.cost import (
    GIB,
    Footprint,
    Usage,
    footprint,
    held_now,
    merge_usage,
    sizes_of,
    spec_versions,
    usage,
)
from strata.stack.manifests import inference_service

ROOT = Path(__file__).resolve().parents[2]


def tier(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "servicetiers" / f"{name}.yaml").read_text())
    return loaded


def service(replicas: int, **cache: Any) -> dict[str, Any]:
    body = inference_service("chat", "premium", resources={"gpus": 2}, maxReplicas=4, cache=cache)
    body["metadata"].update(namespace="team-a", uid="u1")
    body["status"] = {"replicas": replicas}
    return body


def test_gpu_seconds_and_cache_gib_hours_over_an_interval() -> None:
    fp = Footprint(
        replicas=3, gpus_per_replica=2, dram_bytes=8 * GIB, nvme_bytes=100 * GIB, shared_bytes=50 * GIB
    )
    u = usage(fp, 1800.0)
    assert u.gpu_seconds == 3 * 2 * 1800
    assert u.cache_gib_hours == {"dram": 12.0, "nvme": 150.0, "shared": 25.0}


def test_footprint_resolves_the_sizes_the_tier_gives() -> None:
    fp = footprint(service(2, dram="8Gi", shared=True), tier("premium"))
    assert fp == Footprint(2, 2, dram_bytes=8 * GIB, nvme_bytes=200 * GIB, shared_bytes=500 * GIB)
    assert footprint(service(2), None) is None  # unknown tier: the operator rendered nothing
    assert footprint(service(0), tier("premium")).replicas == 0  # type: ignore[union-attr]


def test_sizes_are_remembered_by_spec_versions_and_replicas_read_from_status_each_time() -> None:
    premium, svc = tier("premium"), service(2, dram="8Gi")
    sizes = sizes_of(svc, premium)
    assert sizes is not None and sizes.replicas == 0
    assert held_now(sizes, service(3)) == footprint(service(3, dram="8Gi"), premium)
    versions = spec_versions(svc, premium)
    svc["status"] = {"replicas": 4}  # a status move is no new spec
    assert spec_versions(svc, premium) == versions
    svc["metadata"]["generation"] = 2
    assert spec_versions(svc, premium) != versions
    recreated = {**premium, "metadata": {**premium["metadata"], "uid": "another"}}
    assert spec_versions(service(2), recreated) != spec_versions(service(2), premium)


def test_merge_usage_adds_to_the_tiers_status_per_namespace() -> None:
    first = merge_usage(None, {"team-a": Usage(100.0, {"dram": 1.0, "nvme": 2.0, "shared": 0.0})}, "T1")
    assert first["since"] == "T1" and first["gpuSeconds"] == 100.0
    second = merge_usage(
        first,
        {"team-a": Usage(50.0, {"dram": 0.5}), "team-b": Usage(10.0)},
        "T2",
    )
    assert second["since"] == "T1" and second["updatedAt"] == "T2"
    assert second["gpuSeconds"] == 160.0
    assert second["cacheGiBHours"] == {"dram": 1.5, "nvme": 2.0, "shared": 0.0}
    by_ns = {n["namespace"]: n for n in second["namespaces"]}
    assert by_ns["team-a"]["gpuSeconds"] == 150.0 and by_ns["team-b"]["gpuSeconds"] == 10.0


@pytest.mark.parametrize("seconds", [0.0, 15.0])
def test_usage_is_linear_in_time(seconds: float) -> None:
    fp = Footprint(replicas=1, gpus_per_replica=8)
    assert usage(fp, seconds).gpu_seconds == 8 * seconds
