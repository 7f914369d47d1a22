"""The ValidatingAdmissionPolicy that keeps each InferenceService within its ServiceTier.

``paramRef.name`` cannot come from the object being admitted, so the binding selects every
ServiceTier (``selector: {}``) and the API server runs the policy once per tier; each rule first
asks "is this my tier?" (``object.spec.tier != params.metadata.name || ...``). With no tiers at
all, ``parameterNotFoundAction: Allow`` admits the object, and the operator's Accepted condition
reports the unknown tier. The rules and messages match ``tierlimits.check_against_tier``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from strata.operator.api.cel import size_le
from strata.operator.api.crds import LABELS
from strata.operator.api.models import GROUP, VERSION

JsonDict = dict[str, Any]

POLICY_NAME = "strata-inferenceservice-tier-limits"
NOT_MY_TIER = "object.spec.tier != params.metadata.name"
TIER = "' ServiceTier ' + params.metadata.name + ' '"


@dataclass(frozen=True)
class TierRule:
    """One cross-object rule: when it holds, and the message (a CEL string) when it does not."""

    holds: str
    message: str


def _size_rule(field: str) -> TierRule:
    asked, limit = f"object.spec.cache.{field}", f"params.spec.cache.{field}.maxSize"
    return TierRule(
        holds=f"!has({asked}) || {size_le(asked, limit)}",
        message=f"'spec.cache.{field}: ' + string({asked}) + ' exceeds' + {TIER} + "
        f"'cache.{field}.maxSize ' + string({limit})",
    )


TIER_RULES: tuple[TierRule, ...] = (
    _size_rule("dram"),
    _size_rule("nvme"),
    TierRule(
        holds="!object.spec.cache.shared || params.spec.cache.shared.enabled",
        message="'spec.cache.shared:' + " + TIER + " + 'does not enable the shared tier'",
    ),
    TierRule(
        holds="object.spec.resources.gpus <= params.spec.limits.maxGpusPerReplica",
        message="'spec.resources.gpus: ' + string(object.spec.resources.gpus) + ' exceeds' + "
        + TIER
        + " + 'limits.maxGpusPerReplica ' + string(params.spec.limits.maxGpusPerReplica)",
    ),
    TierRule(
        holds="object.spec.resources.gpus * object.spec.maxReplicas <= params.spec.limits.maxGpusPerService",
        message="'spec.maxReplicas: ' + string(object.spec.maxReplicas) + ' replicas x ' + "
        "string(object.spec.resources.gpus) + ' GPUs exceeds' + "
        + TIER
        + " + 'limits.maxGpusPerService ' + string(params.spec.limits.maxGpusPerService)",
    ),
    TierRule(
        holds="object.spec.maxReplicas <= params.spec.autoscaling.maxReplicas",
        message="'spec.maxReplicas: ' + string(object.spec.maxReplicas) + ' exceeds' + "
        + TIER
        + " + 'autoscaling.maxReplicas ' + string(params.spec.autoscaling.maxReplicas)",
    ),
    TierRule(
        holds="object.spec.minReplicas >= params.spec.autoscaling.minReplicas",
        message="'spec.minReplicas: ' + string(object.spec.minReplicas) + ' is below' + "
        + TIER
        + " + 'autoscaling.minReplicas ' + string(params.spec.autoscaling.minReplicas)",
    ),
)


def admission_policy() -> JsonDict:
    validations = [
        {
            "expression": f"{NOT_MY_TIER} || ({rule.holds})",
            "messageExpression": rule.message,
            "reason": "Invalid",
        }
        for rule in TIER_RULES
    ]
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": POLICY_NAME, "labels": dict(LABELS)},
        "spec": {
            "failurePolicy": "Fail",
            "paramKind": {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ServiceTier"},
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [GROUP],
                        "apiVersions": [VERSION],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": ["inferenceservices"],
                    }
                ]
            },
            "validations": validations,
        },
    }


def admission_policy_binding() -> JsonDict:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": POLICY_NAME, "labels": dict(LABELS)},
        "spec": {
            "policyName": POLICY_NAME,
            "paramRef": {"selector": {}, "parameterNotFoundAction": "Allow"},
            "validationActions": ["Deny"],
        },
    }
