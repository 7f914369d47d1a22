"""What a service holds and what that costs over time, per tenant and tier (pure).

GPU-seconds are replicas x GPUs per replica x seconds (the pods that exist, ready or not: a
starting pod holds its GPUs too). Cache GiB-hours are per cache tier: the DRAM and NVMe tiers
per replica, the shared tier once per service (its claim exists as long as the service does).
HBM is part of the GPUs and is not counted again."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from strata.common.tiers import LOWER_TIERS
from strata.operator.resolve import ResolveInput, SpecRejected, resolve

GIB = 2**30
# resolve() salts the cache namespace with the namespace's UID; sizes do not depend on it.
ANY_UID = "00000000-0000-0000-0000-000000000000"


@dataclass(frozen=True)
class Footprint:
    """What one service holds right now."""

    replicas: int
    gpus_per_replica: int
    dram_bytes: int = 0  # per replica
    nvme_bytes: int = 0  # per replica
    shared_bytes: int = 0  # per service


@dataclass
class Usage:
    gpu_seconds: float = 0.0
    cache_gib_hours: dict[str, float] = field(default_factory=lambda: dict.fromkeys(LOWER_TIERS, 0.0))

    def add(self, other: Usage) -> None:
        self.gpu_seconds += other.gpu_seconds
        for tier, value in other.cache_gib_hours.items():
            self.cache_gib_hours[tier] = self.cache_gib_hours.get(tier, 0.0) + value


def usage(fp: Footprint, seconds: float) -> Usage:
    hours = seconds / 3600
    per_replica = {"dram": fp.dram_bytes, "nvme": fp.nvme_bytes}
    cache = {tier: fp.replicas * size / GIB * hours for tier, size in per_replica.items()}
    cache["shared"] = fp.shared_bytes / GIB * hours
    return Usage(fp.replicas * fp.gpus_per_replica * seconds, cache)


def footprint(service: Mapping[str, Any], tier: Mapping[str, Any] | None) -> Footprint | None:
    """From the service as the API server returned it and its tier; None when it cannot be
    resolved (the reconciler reports why) and so holds nothing the operator rendered."""
    sizes = sizes_of(service, tier)
    return None if sizes is None else held_now(sizes, service)


def sizes_of(service: Mapping[str, Any], tier: Mapping[str, Any] | None) -> Footprint | None:
    """What one replica (and the service) holds by its spec and tier, replicas left at 0: the
    part worth remembering until either spec changes (see :func:`spec_versions`)."""
    try:
        plan = resolve(ResolveInput(service, tier, namespace_uid=ANY_UID))
    except SpecRejected:
        return None
    return Footprint(
        replicas=0,
        gpus_per_replica=plan.gpus,
        dram_bytes=plan.dram_bytes,
        nvme_bytes=plan.nvme.size_bytes if plan.nvme is not None else 0,
        shared_bytes=plan.shared.size_bytes if plan.shared is not None else 0,
    )


def held_now(sizes: Footprint, service: Mapping[str, Any]) -> Footprint:
    """``sizes`` with the replicas the service's status counts now."""
    return replace(sizes, replicas=int((service.get("status") or {}).get("replicas") or 0))


def spec_versions(service: Mapping[str, Any], tier: Mapping[str, Any] | None) -> tuple[Any, ...]:
    """Changes whenever :func:`sizes_of` may: either object's spec (its generation) or the tier
    itself (deleted and re-created under the same name)."""
    tier_meta = (tier or {}).get("metadata") or {}
    generation = service.get("metadata", {}).get("generation")
    return (generation, tier_meta.get("uid"), tier_meta.get("generation"))


def merge_usage(existing: Mapping[str, Any] | None, added: Mapping[str, Usage], now: str) -> dict[str, Any]:
    """A ServiceTier's ``status.usage`` plus what its namespaces accrued since the last write."""
    old = dict(existing or {})
    by_ns = {n["namespace"]: _usage_of(n) for n in old.get("namespaces") or [] if "namespace" in n}
    for namespace, usage_ in added.items():
        by_ns.setdefault(namespace, Usage()).add(usage_)
    total = _usage_of(old)
    for usage_ in added.values():
        total.add(usage_)
    return {
        "since": old.get("since") or now,
        "updatedAt": now,
        **_usage_wire(total),
        "namespaces": [{"namespace": ns, **_usage_wire(u)} for ns, u in sorted(by_ns.items())],
    }


def _usage_of(wire: Mapping[str, Any]) -> Usage:
    hours = wire.get("cacheGiBHours") or {}
    return Usage(float(wire.get("gpuSeconds") or 0), {t: float(hours.get(t) or 0) for t in LOWER_TIERS})


def _usage_wire(u: Usage) -> dict[str, Any]:
    return {
        "gpuSeconds": round(u.gpu_seconds, 1),
        "cacheGiBHours": {t: round(u.cache_gib_hours.get(t, 0.0), 4) for t in LOWER_TIERS},
    }
