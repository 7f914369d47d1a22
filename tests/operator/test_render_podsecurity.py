"""Every pod the operator renders meets the ``restricted`` Pod Security Standard: worker pods (the
engine, the model fetch, the KV-tier sidecar) of both engine kinds, routers (with their own model
fetch), for every tier, model source and NVMe volume mode, in a namespace that enforces it. A
hostPath NVMe tier is an emptyDir there."""

from __future__ import annotations

from typing import Any

import pytest

from strata.operator.plan import ServicePlan
from strata.operator.render.router import render_router_deployment
from strata.operator.render.volumes import nvme_source
from strata.operator.render.workload import render_workload
from strata.operator.resolve import ResolveInput, resolve
from strata.operator.settings import NVME_VOLUME_MODES, OperatorSettings
from strata.operator.tenancy import host_path_allowed
from tests.tenancy.podsecurity import restricted_violations

from .factories import NS_UID, isvc_body, tier_body

SOURCES: dict[str, dict[str, Any]] = {
    "builtin": {"builtin": "tiny"},
    "uri": {"uri": "hf://example/model"},
    "pvc": {"pvc": {"claimName": "weights", "path": "llama"}},
}
RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted"}


def plan_of(tier: str, source: str, vllm: bool, allowed: bool) -> ServicePlan:
    body = isvc_body(tier=tier, cache={"shared": tier == "premium"})
    body["spec"]["model"]["source"] = SOURCES[source]
    if vllm:
        body["spec"]["engine"] = {"kind": "vllm", "blockSize": 32, "vllm": {"args": []}}
    return resolve(ResolveInput(body, tier_body(tier), NS_UID, host_path_allowed=allowed))


def pod_specs(plan: ServicePlan, settings: OperatorSettings) -> dict[str, dict[str, Any]]:
    return {
        "worker": render_workload(plan, settings)["spec"]["template"]["spec"],
        "router": render_router_deployment(plan, settings)["spec"]["template"]["spec"],
    }


@pytest.mark.parametrize("mode", NVME_VOLUME_MODES)
@pytest.mark.parametrize("vllm", [False, True])
@pytest.mark.parametrize("source", sorted(SOURCES))
@pytest.mark.parametrize("tier", ["premium", "standard", "batch"])
def test_every_rendered_pod_meets_the_restricted_standard(
    tier: str, source: str, vllm: bool, mode: str
) -> None:
    settings = OperatorSettings(nvme_volume=mode)  # type: ignore[arg-type]
    plan = plan_of(tier, source, vllm, allowed=host_path_allowed(RESTRICTED))
    for kind, spec in pod_specs(plan, settings).items():
        assert restricted_violations(spec) == [], kind
        containers = [*spec.get("initContainers", []), *spec["containers"]]
        assert containers and all(
            c["securityContext"]["allowPrivilegeEscalation"] is False for c in containers
        )


def test_a_host_path_nvme_tier_is_an_empty_dir_where_the_namespace_refuses_host_paths() -> None:
    settings = OperatorSettings(nvme_volume="hostPath")
    allowed, refused = (plan_of("standard", "builtin", False, allowed=a) for a in (True, False))
    assert nvme_source(allowed, settings) == "hostPath" and nvme_source(refused, settings) == "emptyDir"
    (open_violation,) = restricted_violations(pod_specs(allowed, settings)["worker"])
    assert "volume nvme: ['hostPath'] not allowed" in open_violation  # the checker does see it
    volumes = {v["name"]: v for v in pod_specs(refused, settings)["worker"]["volumes"]}
    assert volumes["nvme"] == {"name": "nvme", "emptyDir": {}}
    sidecar = next(
        c for c in pod_specs(refused, settings)["worker"]["initContainers"] if c["name"] == "kvtier"
    )
    assert all("subPathExpr" not in m for m in sidecar["volumeMounts"])


@pytest.mark.parametrize(
    ("labels", "allowed"),
    [
        ({}, True),
        ({"pod-security.kubernetes.io/enforce": "privileged"}, True),
        ({"pod-security.kubernetes.io/warn": "restricted"}, True),  # a warning admits the pod
        ({"pod-security.kubernetes.io/enforce": "baseline"}, False),
        (RESTRICTED, False),
    ],
)
def test_the_namespace_label_says_whether_host_paths_are_admitted(
    labels: dict[str, str], allowed: bool
) -> None:
    assert host_path_allowed(labels) is allowed
