"""Policies by name, built per service."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from strata.sim.policies.base import Scaler
from strata.sim.policies.builtin import Builtin
from strata.sim.policies.kpa import Kpa, KpaSettings
from strata.sim.policies.planner import Planner
from strata.sim.policies.saturation import Saturation
from strata.sim.policies.static import Static
from strata.sim.service import Service

STATIC = ("static_peak", "static_mean")
DYNAMIC = ("kv_threshold", "kpa", "planner", "builtin")
POLICIES = (*STATIC, *DYNAMIC)


@dataclass(frozen=True)
class Knobs:
    """What a policy needs beyond the service: static sizes (per service) and KPA targets."""

    static: Mapping[str, Mapping[str, int]] = field(default_factory=dict)  # policy -> service -> N
    kpa_target: Mapping[str, float] = field(default_factory=dict)  # service -> in flight per replica
    kpa_default_target: float = 4.0


def factory(policy: str, knobs: Knobs) -> Callable[[Service], Scaler]:
    if policy not in POLICIES:
        raise ValueError(f"policy: unknown {policy!r}; expected one of {', '.join(POLICIES)}")

    def make(service: Service) -> Scaler:
        if policy in STATIC:
            sizes = knobs.static.get(policy, {})
            if service.name not in sizes:
                raise ValueError(f"policy {policy}: no replica count sized for service {service.name!r}")
            return Static(policy, sizes[service.name], f"{policy}: {sizes[service.name]} replicas")
        if policy == "kv_threshold":
            return Saturation()
        if policy == "kpa":
            target = knobs.kpa_target.get(service.name, knobs.kpa_default_target)
            return Kpa(KpaSettings(target=target), service.spec.autoscaling.scale_to_zero)
        if policy == "planner":
            return Planner(service)
        return Builtin(service)

    return make
