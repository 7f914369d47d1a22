"""Turn a pydantic JSON schema into a Kubernetes structural OpenAPI v3 schema.

Pydantic emits JSON Schema 2020-12 with ``$ref``s, ``anyOf [X, null]`` for optional fields, ``const``
and numeric ``exclusiveMinimum``; a CRD needs a structural OpenAPI v3.0 schema: everything inline,
one type per node, boolean ``exclusiveMinimum``, no titles. Optional fields become plain
non-required fields (the API server prunes nulls of non-nullable fields before defaulting), and a
nested object with defaults inside gets a default holding them, so an omitted section is filled in.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

JsonDict = dict[str, Any]

# JSON-Schema keywords with no place in a structural schema, or no meaning to Kubernetes.
_DROPPED = {"title", "additionalProperties", "$defs", "examples"}


class SchemaError(ValueError):
    """The model uses a construct that has no structural-schema equivalent."""


def structural_schema(model: type[BaseModel]) -> JsonDict:
    """The structural OpenAPI v3 schema of ``model``, as it goes into a CRD."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    return _convert(raw, raw.get("$defs", {}), path=model.__name__)


def _convert(node: JsonDict, defs: JsonDict, path: str) -> JsonDict:
    node = _resolve(_strip_null(_resolve(node, defs), path), defs)
    out: JsonDict = {}
    for key, value in node.items():
        if key in _DROPPED:
            continue
        if key == "properties":
            out["properties"] = _properties(value, node.get("required", []), defs, path)
        elif key == "items":
            out["items"] = _convert(value, defs, f"{path}[]")
        elif key == "const":
            out["enum"] = [value]
        elif key in ("exclusiveMinimum", "exclusiveMaximum"):
            bound = "minimum" if key == "exclusiveMinimum" else "maximum"
            out[bound] = value
            out[key] = True
        elif key == "default" and value is None:
            continue
        else:
            out[key] = value
    if "anyOf" in out and not out.get("x-kubernetes-int-or-string"):
        raise SchemaError(f"{path}: a union of several types is not structural")
    if {"allOf", "oneOf", "not"} & out.keys():
        raise SchemaError(f"{path}: allOf, oneOf and not are not supported here; give the field one type")
    if node.get("additionalProperties") not in (None, False):
        out["additionalProperties"] = _convert(node["additionalProperties"], defs, f"{path}{{}}")
    return out


def _properties(props: JsonDict, required: list[str], defs: JsonDict, path: str) -> JsonDict:
    converted: JsonDict = {}
    for name, prop in props.items():
        field_path = f"{path}.{name}"
        schema = _convert(prop, defs, field_path)
        if "description" not in schema:
            raise SchemaError(f"{field_path}: every field needs a description (kubectl explain shows it)")
        optional = name not in required and not _is_nullable(prop)
        if optional and "default" not in schema and schema.get("type") == "object":
            filled = filled_default(schema)
            if filled:
                schema["default"] = filled
        converted[name] = schema
    return converted


def filled_default(schema: JsonDict) -> JsonDict:
    """The default of an object that is never null: each field's own default, spelled out.

    ``default: {}`` would be filled in the same way by the API server, but CEL rules are checked
    against the literal default when the CRD is created, so it must already hold every field.
    Nested objects were converted first, so their defaults are already complete.
    """
    return {name: prop["default"] for name, prop in schema.get("properties", {}).items() if "default" in prop}


def _is_nullable(prop: JsonDict) -> bool:
    return any(branch == {"type": "null"} for branch in prop.get("anyOf", []))


def _resolve(node: JsonDict, defs: JsonDict) -> JsonDict:
    """Inline a ``$ref``; keywords beside it (the field's description) win over the target's."""
    if "$ref" not in node:
        return node
    name = node["$ref"].rsplit("/", 1)[-1]
    siblings = {k: v for k, v in node.items() if k != "$ref"}
    return {**_resolve(defs[name], defs), **siblings}


def _strip_null(node: JsonDict, path: str) -> JsonDict:
    """``anyOf [X, null]`` (an Optional field) becomes X."""
    branches = node.get("anyOf")
    if not branches or not any(b == {"type": "null"} for b in branches):
        return node
    rest = [b for b in branches if b != {"type": "null"}]
    if len(rest) != 1:
        raise SchemaError(f"{path}: an optional union of several types is not structural")
    outer = {k: v for k, v in node.items() if k != "anyOf"}
    return {**rest[0], **outer}
