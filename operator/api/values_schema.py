"""The Helm chart's values.schema.json: a wrong value fails ``helm install`` naming it.

Generated (``strata crds generate``) rather than hand-kept, so that ``serviceTiers.tiers.<name>``
is checked against exactly the schema the ServiceTier CRD enforces (eviction policies, quantity
patterns, bounds), minus ``required`` and defaults: there a tier spec is a partial override."""

from __future__ import annotations

from typing import Any

from strata.operator.api.base import DNS_1035_LABEL, DNS_LABEL, DNS_SUBDOMAIN
from strata.operator.api.models import ServiceTierSpec
from strata.operator.api.quantity import QUANTITY_PATTERN
from strata.operator.api.schema import structural_schema

JsonDict = dict[str, Any]

PULL_POLICIES = ["Always", "IfNotPresent", "Never"]
# The release-scoped name takes suffixes such as "-metrics" and "-crds-upgrade".
FULLNAME_MAX = 50


def obj(description: str, **properties: JsonDict) -> JsonDict:
    """A closed object: an unknown key (a typo) is an error."""
    return {
        "type": "object",
        "description": description,
        "additionalProperties": False,
        "properties": properties,
    }


def string(description: str, **extra: Any) -> JsonDict:
    return {"type": "string", "description": description, **extra}


def boolean(description: str) -> JsonDict:
    return {"type": "boolean", "description": description}


def integer(description: str, minimum: int, maximum: int | None = None) -> JsonDict:
    schema: JsonDict = {"type": "integer", "description": description, "minimum": minimum}
    if maximum is not None:
        schema["maximum"] = maximum
    return schema


def free_map(description: str) -> JsonDict:
    return {"type": "object", "description": description}


def string_map(description: str) -> JsonDict:
    return {"type": "object", "description": description, "additionalProperties": {"type": "string"}}


def quantity_map(description: str) -> JsonDict:
    quantity = {"type": "string", "pattern": QUANTITY_PATTERN}
    return {"type": "object", "description": description, "additionalProperties": quantity}


def object_list(description: str) -> JsonDict:
    return {"type": "array", "description": description, "items": {"type": "object"}}


def pull_secrets(description: str) -> JsonDict:
    secret = obj(
        "A Secret of type kubernetes.io/dockerconfigjson.", name=string("Secret name.", pattern=DNS_SUBDOMAIN)
    )
    secret["required"] = ["name"]
    return {"type": "array", "description": description, "items": secret}


def namespaces(description: str) -> JsonDict:
    return {
        "type": "array",
        "description": description,
        "uniqueItems": True,
        "items": string("A namespace.", pattern=DNS_LABEL, maxLength=63),
    }


def port(description: str) -> JsonDict:
    return integer(description, 1, 65535)


def partial(schema: JsonDict) -> JsonDict:
    """A schema that accepts any subset of the fields: no ``required``, no defaults (Helm
    would not fill them in anyway, and the CRD's own defaulting does it on the server)."""
    out = {k: v for k, v in schema.items() if k not in ("required", "default")}
    for bound in ("Minimum", "Maximum"):  # OpenAPI 3.0's boolean form -> JSON Schema's number
        if out.get(f"exclusive{bound}") is True:
            out[f"exclusive{bound}"] = out.pop(bound.lower())
    if "properties" in out:
        out["properties"] = {k: partial(v) for k, v in out["properties"].items()}
        out["additionalProperties"] = False
    if isinstance(out.get("items"), dict):
        out["items"] = partial(out["items"])
    return out


def operator_schema() -> JsonDict:
    return obj(
        "The operator Deployment.",
        replicas=integer("Operator replicas; more than one share a ClusterKopfPeering.", 0, 10),
        peering=obj(
            "kopf peering between the replicas.",
            enabled=boolean("Use a ClusterKopfPeering (with more than one replica)."),
            name=string(
                "ClusterKopfPeering name; empty: the release's full name.",
                anyOf=[{"maxLength": 0}, {"pattern": DNS_SUBDOMAIN, "maxLength": 253}],
            ),
        ),
        priority={
            "description": "Peering priority: `auto` (random per pod start) or an integer.",
            "anyOf": [{"type": "integer"}, {"type": "string", "enum": ["auto"]}],
        },
        watchNamespaces=namespaces("Namespaces this release serves (one replica); empty: all."),
        logFormat=string("Log format.", enum=["json", "plain"]),
        metricsPort=port("Prometheus metrics port."),
        livenessPort=port("kopf liveness (/healthz) port."),
        resources=free_map("Container resources (requests, limits)."),
        podAnnotations=string_map("Annotations of the operator pods."),
        podLabels=string_map("Extra labels of the operator pods."),
        podDisruptionBudget=obj(
            "PodDisruptionBudget of the operator pods.",
            enabled=boolean("Render the PodDisruptionBudget."),
            maxUnavailable=integer("Operator pods a drain may take at once.", 1),
        ),
        nodeSelector=string_map("nodeSelector of the operator pods."),
        tolerations=object_list("Tolerations of the operator pods."),
        affinity=free_map("Affinity of the operator pods."),
    )


def worker_schema() -> JsonDict:
    return obj(
        "Operator settings for the worker pods it renders.",
        image=string("Default worker image.", minLength=1),
        vllmImage=string(
            "Default engine image of engine.kind vllm (vLLM with Strata installed).", minLength=1
        ),
        imagePullPolicy=string("Worker image pull policy.", enum=PULL_POLICIES),
        imagePullSecrets=pull_secrets("Secrets for the worker image, present in every tenant namespace."),
        nvmeVolume=string("How the cluster provides local NVMe.", enum=["ephemeral", "hostPath"]),
        nvmeHostPath=string("Host directory for nvmeVolume: hostPath.", pattern="^/"),
        tolerations=object_list("Extra tolerations of the worker pods."),
    )


def router_schema() -> JsonDict:
    return obj(
        "Operator settings for the router pods it renders (they take worker.tolerations too).",
        nodeSelector=string_map("nodeSelector of the router pods (they need no GPU)."),
        resources=obj(
            "Resources of the router container.",
            requests=quantity_map("Requests (cpu, memory)."),
            limits=quantity_map("Limits (cpu, memory)."),
        ),
    )


def monitoring_schema() -> JsonDict:
    interval = string("Scrape interval (a Prometheus duration).", pattern="^[0-9]+(ms|s|m|h)$")
    return obj(
        "Prometheus Operator objects, each rendered only where its CRD exists.",
        labels=string_map("Extra labels on every monitoring object."),
        serviceMonitor=obj(
            "The operator's ServiceMonitor.", enabled=boolean("Render it."), interval=interval
        ),
        podMonitor=obj(
            "Workers', sidecars' and routers' PodMonitors.",
            enabled=boolean("Render them."),
            interval=interval,
        ),
        prometheusRule=obj("Recording rules and alerts.", enabled=boolean("Render it.")),
        dashboard=obj(
            "The Grafana dashboard ConfigMap.",
            enabled=boolean("Render it."),
            labels=string_map("Labels Grafana's dashboard sidecar selects."),
            annotations=string_map("Annotations (e.g. the sidecar's target folder)."),
            namespace=string(
                "Namespace of the ConfigMap; empty: the release's.", pattern=f"^({DNS_LABEL[1:-1]})?$"
            ),
        ),
    )


def values_schema() -> JsonDict:
    tier = partial(structural_schema(ServiceTierSpec))
    tier["description"] = "ServiceTier spec fields, merged over the default tier of that name."
    schema = obj(
        "Values of the Strata chart.",
        nameOverride=string("Replaces the chart name in object names.", pattern=f"^({DNS_LABEL[1:-1]})?$"),
        fullnameOverride=string(
            "Replaces the release-scoped name of every object.",
            pattern=f"^({DNS_1035_LABEL[1:-1]})?$",
            maxLength=FULLNAME_MAX,
        ),
        image=obj(
            "The operator image.",
            repository=string("Image repository.", minLength=1),
            tag=string("Image tag; empty: the chart's appVersion."),
            pullPolicy=string("Image pull policy.", enum=PULL_POLICIES),
        ),
        imagePullSecrets=pull_secrets("Secrets for the operator image, in the release namespace."),
        operator=operator_schema(),
        worker=worker_schema(),
        router=router_schema(),
        serviceTiers=obj(
            "The default ServiceTiers.",
            install=boolean("Install the default tiers."),
            tiers={
                "type": "object",
                "description": "Per tier name, spec overrides or a new tier.",
                "propertyNames": {"pattern": DNS_LABEL, "maxLength": 63},
                "additionalProperties": tier,
            },
        ),
        admissionPolicy=obj(
            "The tier-limits ValidatingAdmissionPolicy (one per cluster).",
            install=boolean("Install the policy and its binding."),
        ),
        crds=obj("CRD upgrades.", upgrade=boolean("Apply this version's CRDs in a pre-upgrade hook Job.")),
        monitoring=monitoring_schema(),
        networkPolicy=obj(
            "NetworkPolicies: each InferenceService's workers only from its routers; the operator pods.",
            enabled=boolean("Render them (the operator's per service and the chart's)."),
            metricsNamespaces=namespaces("Namespaces whose pods may scrape the workers (Prometheus's)."),
        ),
        rbac=obj("RBAC.", create=boolean("Create the ClusterRole and its binding.")),
        test=obj(
            "The `helm test` pod.",
            timeoutSeconds=integer("Seconds it waits for the operator to answer /healthz.", 1),
        ),
        serviceAccount=obj(
            "The operator's ServiceAccount.",
            create=boolean("Create it."),
            name=string("Its name; empty: the release's full name.", pattern=f"^({DNS_SUBDOMAIN[1:-1]})?$"),
            annotations=string_map("Annotations (e.g. a cloud IAM role)."),
        ),
    )
    schema["$schema"] = "http://json-schema.org/draft-07/schema#"
    return schema
