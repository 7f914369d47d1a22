"""The ValidatingAdmissionPolicy that keeps each InferenceService within its ServiceTier.

``paramRef.name`` cannot come from the object being admitted, so the binding selects every
ServiceTier (``selector: {}``) and the API server runs the policy once per tier; each rule first
asks "is this my tier?" (``!variables.myTier || ...``). With no tiers at
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
# Defined once as a policy variable; every rule starts with `!variables.myTier || ...`.
MY_TIER = "object.spec.tier == params.metadata.name"


@dataclass(frozen=True)
class Expr:
    """A CEL expression inside a message, as opposed to literal text."""

    cel: str


def message(*parts: str | Expr) -> str:
    """A CEL string expression concatenating literal text and ``string()`` of expressions."""
    pieces = [f"string({part.cel})" if isinstance(part, Expr) else _literal(part) for part in parts]
    return " + ".join(pieces)


def _literal(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


TIER = Expr("params.metadata.name")


@dataclass(frozen=True)
class TierRule:
    """One cross-object rule: when it holds, and the message (a CEL string) when it does not."""

    holds: str
    message: str


def _size_rule(field: str) -> TierRule:
    asked, limit = f"object.spec.cache.{field}", f"params.spec.cache.{field}.maxSize"
    return TierRule(
        holds=f"!has({asked}) || {size_le(asked, limit)}",
        message=message(
            f"spec.cache.{field}: ",
            Expr(asked),
            " exceeds ServiceTier ",
            TIER,
            f" cache.{field}.maxSize ",
            Expr(limit),
        ),
    )


TIER_RULES: tuple[TierRule, ...] = (
    _size_rule("dram"),
    _size_rule("nvme"),
    TierRule(
        holds="!object.spec.cache.shared || params.spec.cache.shared.enabled",
        message=message("spec.cache.shared: ServiceTier ", TIER, " does not enable the shared tier"),
    ),
    TierRule(
        holds="object.spec.resources.gpus <= params.spec.limits.maxGpusPerReplica",
        message=message(
            "spec.resources.gpus: ",
            Expr("object.spec.resources.gpus"),
            " exceeds ServiceTier ",
            TIER,
            " limits.maxGpusPerReplica ",
            Expr("params.spec.limits.maxGpusPerReplica"),
        ),
    ),
    TierRule(
        holds="object.spec.resources.gpus * object.spec.maxReplicas <= params.spec.limits.maxGpusPerService",
        message=message(
            "spec.maxReplicas: ",
            Expr("object.spec.maxReplicas"),
            " replicas x ",
            Expr("object.spec.resources.gpus"),
            " GPUs exceeds ServiceTier ",
            TIER,
            " limits.maxGpusPerService ",
            Expr("params.spec.limits.maxGpusPerService"),
        ),
    ),
    TierRule(
        holds="object.spec.maxReplicas <= params.spec.autoscaling.maxReplicas",
        message=message(
            "spec.maxReplicas: ",
            Expr("object.spec.maxReplicas"),
            " exceeds ServiceTier ",
            TIER,
            " autoscaling.maxReplicas ",
            Expr("params.spec.autoscaling.maxReplicas"),
        ),
    ),
    TierRule(
        holds="object.spec.minReplicas >= params.spec.autoscaling.minReplicas",
        message=message(
            "spec.minReplicas: ",
            Expr("object.spec.minReplicas"),
            " is below ServiceTier ",
            TIER,
            " autoscaling.minReplicas ",
            Expr("params.spec.autoscaling.minReplicas"),
        ),
    ),
)


def admission_policy() -> JsonDict:
    validations = [
        {
            "expression": f"!variables.myTier || ({rule.holds})",
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
            "variables": [{"name": "myTier", "expression": MY_TIER}],
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
