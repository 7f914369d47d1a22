"""``spec.pod``: what a tenant may set on the worker pods, bounded as the API server bounds it.

Environment variables (an ``HF_TOKEN`` or ``STRATA_API_KEY`` from a Secret), envFrom, image pull
secrets, a ServiceAccount, pod labels and annotations, a node selector, affinity and extra
tolerations: what a real cluster needs to serve a gated model from a private registry on the
right nodes. Typed and bounded here, so a mistake is refused at admission naming the field
rather than surfacing as a pod the StatefulSet controller cannot create. Keys the operator owns
(its labels, its environment variables) cannot be overridden.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, WithJsonSchema, field_validator, model_validator

from strata.operator.api.base import DNS_SUBDOMAIN, ApiModel, exactly_one
from strata.operator.api.cel import one_of, rule, rules

ENV_NAME = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
CONFIG_KEY = r"^[-._a-zA-Z0-9]+$"
LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
# A qualified name: an optional DNS-subdomain prefix and "/", then a name of up to 63 characters.
QUALIFIED_NAME = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
OWNED_PREFIXES = ("strata.dev/", "app.kubernetes.io/")
OWNED_ENV = ("POD_NAME", "POD_NAMESPACE")
MAX_ENV, MAX_ENV_FROM, MAX_PULL_SECRETS, MAX_KEYS, MAX_TOLERATIONS = 64, 16, 8, 32, 16

ObjectName = Annotated[str, Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)]


class KeyRef(ApiModel):
    name: ObjectName = Field(description="The Secret or ConfigMap, in the service's namespace.")
    key: str = Field(min_length=1, max_length=253, pattern=CONFIG_KEY, description="Key within it.")
    optional: bool = Field(False, description="Start the pod even if the key is missing.")


class EnvVarSource(ApiModel):
    model_config = ConfigDict(json_schema_extra=one_of("valueFrom", "secretKeyRef", "configMapKeyRef"))

    secret_key_ref: KeyRef | None = Field(None, description="A key of a Secret.")
    config_map_key_ref: KeyRef | None = Field(None, description="A key of a ConfigMap.")

    @model_validator(mode="after")
    def _one(self) -> EnvVarSource:
        exactly_one(self, ("secret_key_ref", "config_map_key_ref"), "valueFrom")
        return self


class EnvVar(ApiModel):
    model_config = ConfigDict(
        json_schema_extra=rules(
            rule("!(has(self.value) && has(self.valueFrom))", "set value or valueFrom, not both")
        )
    )

    name: str = Field(min_length=1, max_length=256, pattern=ENV_NAME, description="Variable name.")
    value: str | None = Field(None, max_length=32768, description="A literal value.")
    value_from: EnvVarSource | None = Field(None, description="A value read from a Secret or ConfigMap.")

    @model_validator(mode="after")
    def _not_both(self) -> EnvVar:
        if self.value is not None and self.value_from is not None:
            raise ValueError(f"env {self.name}: set value or valueFrom, not both")
        return self


class NameRef(ApiModel):
    name: ObjectName = Field(description="Object name, in the service's namespace.")
    optional: bool = Field(False, description="Start the pod even if it is missing.")


class EnvFromSource(ApiModel):
    model_config = ConfigDict(json_schema_extra=one_of("envFrom", "secretRef", "configMapRef"))

    secret_ref: NameRef | None = Field(None, description="Every key of a Secret becomes a variable.")
    config_map_ref: NameRef | None = Field(None, description="Every key of a ConfigMap becomes a variable.")
    prefix: str | None = Field(None, max_length=256, pattern=ENV_NAME, description="Prepended to each key.")

    @model_validator(mode="after")
    def _one(self) -> EnvFromSource:
        exactly_one(self, ("secret_ref", "config_map_ref"), "envFrom")
        return self


class LocalObjectReference(ApiModel):
    name: ObjectName = Field(description="A Secret of type kubernetes.io/dockerconfigjson.")


class Toleration(ApiModel):
    key: str | None = Field(
        None, max_length=316, pattern=QUALIFIED_NAME, description="Taint key; empty: all."
    )
    operator: Literal["Exists", "Equal"] = Field("Equal", description="Exists or Equal.")
    value: str | None = Field(None, max_length=63, pattern=LABEL_VALUE, description="Taint value for Equal.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="Taint effect; empty: all."
    )
    toleration_seconds: int | None = Field(
        None, ge=0, le=31536000, description="How long a NoExecute taint is tolerated (seconds)."
    )


def _keys_rule(what: str, owned: bool) -> dict[str, Any]:
    check = f"self.all(k, k.size() <= 316 && k.matches(r'{QUALIFIED_NAME}'))"
    if owned:
        check = check[:-1] + " && " + " && ".join(f"!k.startsWith('{p}')" for p in OWNED_PREFIXES) + ")"
    message = f"spec.pod.{what}: keys must be qualified names" + (
        f" outside {', '.join(OWNED_PREFIXES)} (the operator's)" if owned else ""
    )
    return rules(rule(check, message))


def _check_keys(values: dict[str, str] | None, what: str, owned: bool) -> dict[str, str] | None:
    for key in values or {}:
        if len(key) > 316 or not re.match(QUALIFIED_NAME, key):
            raise ValueError(f"spec.pod.{what}: key {key!r} is not a qualified name")
        if owned and key.startswith(OWNED_PREFIXES):
            raise ValueError(f"spec.pod.{what}: key {key!r} is the operator's ({', '.join(OWNED_PREFIXES)})")
    return values


LabelValue = Annotated[str, Field(max_length=63, pattern=LABEL_VALUE)]
# Each part of an affinity is Kubernetes' own type, checked in full when the pod is created.
Opaque = Annotated[
    dict[str, Any], WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True})
]


class Affinity(ApiModel):
    node_affinity: Opaque | None = Field(None, description="Kubernetes NodeAffinity.")
    pod_affinity: Opaque | None = Field(None, description="Kubernetes PodAffinity.")
    pod_anti_affinity: Opaque | None = Field(None, description="Kubernetes PodAntiAffinity.")


class PodOverrides(ApiModel):
    """Settings rendered onto every worker pod; the operator's own settings win where both set one."""

    env: list[EnvVar] | None = Field(
        None,
        max_length=MAX_ENV,
        description="Environment of the engine and of the model-fetch init container: HF_TOKEN for a gated "
        "model, STRATA_API_KEY to require an API key. POD_NAME and POD_NAMESPACE are the operator's.",
    )
    env_from: list[EnvFromSource] | None = Field(
        None, max_length=MAX_ENV_FROM, description="Secrets or ConfigMaps whose keys become variables."
    )
    image_pull_secrets: list[LocalObjectReference] | None = Field(
        None,
        max_length=MAX_PULL_SECRETS,
        description="Secrets to pull the worker image from a private registry.",
    )
    service_account_name: str | None = Field(
        None,
        max_length=253,
        pattern=DNS_SUBDOMAIN,
        description="ServiceAccount of the pods (its token is not mounted).",
    )
    annotations: dict[str, Annotated[str, Field(max_length=4096)]] | None = Field(
        None,
        max_length=MAX_KEYS,
        description="Pod annotations.",
        json_schema_extra=_keys_rule("annotations", True),
    )
    labels: dict[str, LabelValue] | None = Field(
        None, max_length=MAX_KEYS, description="Pod labels.", json_schema_extra=_keys_rule("labels", True)
    )
    node_selector: dict[str, LabelValue] | None = Field(
        None,
        max_length=MAX_KEYS,
        description="Node labels the pods require, on top of the GPU product and local NVMe ones.",
        json_schema_extra=_keys_rule("nodeSelector", False),
    )
    affinity: Affinity | None = Field(None, description="Kubernetes affinity of the pods.")
    tolerations: list[Toleration] | None = Field(
        None, max_length=MAX_TOLERATIONS, description="Tolerations on top of the GPU taint's."
    )

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: list[EnvVar] | None) -> list[EnvVar] | None:
        names = [e.name for e in env or []]
        for name in names:
            if name in OWNED_ENV:
                raise ValueError(f"spec.pod.env: {name} is set by the operator")
            if names.count(name) > 1:
                raise ValueError(f"spec.pod.env: {name} is given twice")
        return env

    @field_validator("annotations", "labels")
    @classmethod
    def _owned_keys(cls, values: dict[str, str] | None) -> dict[str, str] | None:
        return _check_keys(values, "labels/annotations", True)

    @field_validator("node_selector")
    @classmethod
    def _selector_keys(cls, values: dict[str, str] | None) -> dict[str, str] | None:
        return _check_keys(values, "nodeSelector", False)
