"""Does an InferenceService fit its ServiceTier? The cross-object rules, as a pure function.

The same rules run in the API server as a ValidatingAdmissionPolicy (``policy.py``), but that
policy may be absent (an older cluster, a tier created after the service), so the operator runs
this check on every reconcile and reports the result in the ``Accepted`` condition.
"""

from __future__ import annotations

from dataclasses import dataclass

from strata.operator.api.models import InferenceServiceSpec, ServiceTierSpec
from strata.operator.api.quantity import parse_size


@dataclass(frozen=True)
class Violation:
    """One broken rule: the offending field of the InferenceService and why."""

    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


def check_against_tier(
    spec: InferenceServiceSpec, tier: ServiceTierSpec, tier_name: str = ""
) -> list[Violation]:
    """Every way ``spec`` breaks the limits of ``tier``; empty when it fits."""
    name = tier_name or spec.tier
    return [
        *_cache_violations(spec, tier, name),
        *_gpu_violations(spec, tier, name),
        *_replica_violations(spec, tier, name),
    ]


def _cache_violations(spec: InferenceServiceSpec, tier: ServiceTierSpec, name: str) -> list[Violation]:
    found: list[Violation] = []
    for field, asked, policy in (
        ("dram", spec.cache.dram, tier.cache.dram),
        ("nvme", spec.cache.nvme, tier.cache.nvme),
    ):
        if asked is not None and parse_size(asked) > parse_size(policy.max_size):
            found.append(
                Violation(
                    f"spec.cache.{field}",
                    f"{asked} exceeds ServiceTier {name} cache.{field}.maxSize {policy.max_size}",
                )
            )
    if spec.cache.shared and not tier.cache.shared.enabled:
        found.append(Violation("spec.cache.shared", f"ServiceTier {name} does not enable the shared tier"))
    return found


def _gpu_violations(spec: InferenceServiceSpec, tier: ServiceTierSpec, name: str) -> list[Violation]:
    found: list[Violation] = []
    gpus, limits = spec.resources.gpus, tier.limits
    if gpus > limits.max_gpus_per_replica:
        found.append(
            Violation(
                "spec.resources.gpus",
                f"{gpus} exceeds ServiceTier {name} limits.maxGpusPerReplica {limits.max_gpus_per_replica}",
            )
        )
    if gpus * spec.max_replicas > limits.max_gpus_per_service:
        found.append(
            Violation(
                "spec.maxReplicas",
                f"{spec.max_replicas} replicas x {gpus} GPUs exceeds ServiceTier {name} "
                f"limits.maxGpusPerService {limits.max_gpus_per_service}",
            )
        )
    return found


def _replica_violations(spec: InferenceServiceSpec, tier: ServiceTierSpec, name: str) -> list[Violation]:
    found: list[Violation] = []
    # minReplicas 0 needs a tier with minReplicas 0, which the tier may set only with scaleToZero.
    policy = tier.autoscaling
    if spec.max_replicas > policy.max_replicas:
        found.append(
            Violation(
                "spec.maxReplicas",
                f"{spec.max_replicas} exceeds ServiceTier {name} "
                f"autoscaling.maxReplicas {policy.max_replicas}",
            )
        )
    if spec.min_replicas < policy.min_replicas:
        found.append(
            Violation(
                "spec.minReplicas",
                f"{spec.min_replicas} is below ServiceTier {name} "
                f"autoscaling.minReplicas {policy.min_replicas}",
            )
        )
    return found
