"""Names, labels and annotations of everything the operator creates, in one place.

Selectors use only labels that never change for the life of a service (workload selectors are
immutable), so a tier change re-labels pods without orphaning them."""

from __future__ import annotations

from strata.common.apigroup import API_VERSION as API_VERSION
from strata.common.apigroup import GROUP as GROUP
from strata.common.apigroup import VERSION as VERSION

ISVC_KIND = "InferenceService"
ISVC_PLURAL = "inferenceservices"
TIER_KIND = "ServiceTier"
TIER_PLURAL = "servicetiers"

FIELD_MANAGER = "strata-operator"
MANAGED_BY = "strata-operator"

LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_SERVICE = f"{GROUP}/inferenceservice"
LABEL_TIER = f"{GROUP}/tier"
ANNOTATION_CONFIG_HASH = f"{GROUP}/config-hash"

WORKER_APP = "strata-worker"
ROUTER_APP = "strata-router"
CONFIG_DIR = "/etc/strata"
CONFIG_FILE = "worker.yaml"
CONFIG_PATH = f"{CONFIG_DIR}/{CONFIG_FILE}"
ROUTER_CONFIG_FILE = "router.yaml"
ROUTER_CONFIG_PATH = f"{CONFIG_DIR}/{ROUTER_CONFIG_FILE}"


def selector_labels(service: str) -> dict[str, str]:
    return {LABEL_NAME: WORKER_APP, LABEL_INSTANCE: service}


def router_selector_labels(service: str) -> dict[str, str]:
    return {LABEL_NAME: ROUTER_APP, LABEL_INSTANCE: service}


def label_selector(labels: dict[str, str]) -> str:
    """``k=v,k=v``, as the API's labelSelector parameter takes it."""
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def common_labels(service: str, tier: str) -> dict[str, str]:
    return {
        **selector_labels(service),
        LABEL_MANAGED_BY: MANAGED_BY,
        LABEL_SERVICE: service,
        LABEL_TIER: tier,
    }


def workload_name(service: str) -> str:
    return service


def client_service_name(service: str) -> str:
    return service


def metrics_service_name(service: str) -> str:
    return f"{service}-metrics"


def configmap_name(service: str) -> str:
    return f"{service}-config"


def pdb_name(service: str) -> str:
    return service


def router_name(service: str) -> str:
    """The router's Deployment, PDB, ServiceAccount, Role and RoleBinding."""
    return f"{service}-router"


def shared_claim_name(service: str) -> str:
    return f"{service}-kv-shared"


def priority_class_name(tier: str) -> str:
    return f"strata-{tier}"
