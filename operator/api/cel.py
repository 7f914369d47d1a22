"""Helpers that attach Kubernetes validation rules to the pydantic models' JSON schema.

The models are the single source of truth: each CEL rule sits next to the field it guards, as
``json_schema_extra``, and ``strata.operator.api.schema`` carries it into the CRD unchanged.
"""

from __future__ import annotations

from typing import Any

JsonDict = dict[str, Any]


def rule(
    expression: str,
    message: str | None = None,
    *,
    message_expression: str | None = None,
    field_path: str | None = None,
    reason: str | None = None,
) -> JsonDict:
    """One ``x-kubernetes-validations`` entry; every message names the field it is about."""
    entry: JsonDict = {"rule": expression}
    if message is not None:
        entry["message"] = message
    if message_expression is not None:
        entry["messageExpression"] = message_expression
    if field_path is not None:
        entry["fieldPath"] = field_path
    if reason is not None:
        entry["reason"] = reason
    return entry


def rules(*entries: JsonDict) -> JsonDict:
    """``json_schema_extra`` holding the given rules."""
    return {"x-kubernetes-validations": list(entries)}


def immutable(path: str, why: str) -> JsonDict:
    """A transition rule that refuses any change of the field at ``path`` once it is set."""
    return rules(rule("self == oldSelf", f"{path} is immutable: {why}"))


def size_of(cel_field: str) -> str:
    """CEL for the quantity in an int-or-string field, whichever of the two it holds."""
    return f"quantity(string({cel_field}))"


def size_le(small: str, large: str) -> str:
    """CEL: quantity ``small`` is at most quantity ``large``."""
    return f"{size_of(small)}.compareTo({size_of(large)}) <= 0"


def one_of(where: str, *fields: str) -> JsonDict:
    """``json_schema_extra`` requiring exactly one of the (camelCase) ``fields`` to be set."""
    has = ", ".join(f"has(self.{name})" for name in fields)
    return rules(
        rule(f"[{has}].filter(x, x).size() == 1", f"{where}: set exactly one of {', '.join(fields)}")
    )
