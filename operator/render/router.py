"""The service's router: a Deployment of two replicas with a PDB, and the least privilege it runs
with (its own ServiceAccount, a Role that can only read Pods, the RoleBinding between them).

Clients reach the router through the service's client Service; the router watches the worker
Pods itself (``strata.router.discovery``). It reads the model's tokenizer and chat template:
from the model's PVC (read-only), or fetched by an init container for a URI source; the built-in
test models need no files. The router never writes to the API: waking a service at zero is the
operator's autoscaler's job, from the router's held-requests metric.
"""

from __future__ import annotations

from strata.operator import names
from strata.operator.api.quantity import parse_size
from strata.operator.plan import ServicePlan
from strata.operator.render.common import Manifest, bytes_quantity, content_hash, metadata
from strata.operator.render.pod import (
    LISTEN_ON_POD_IP,
    container_security_context,
    image,
    model_fetcher,
    pod_env,
    pod_overrides,
    pod_security_context,
)
from strata.operator.render.volumes import engine_mounts, model_volume
from strata.operator.settings import OperatorSettings
from strata.worker.config import API_KEY_ENV

ROUTER_REPLICAS = 2
COMPONENT = "router"
RBAC_API = "rbac.authorization.k8s.io/v1"
# What the router may do in its namespace, and so what the operator must hold to grant it: it
# lists and watches, never gets one Pod at a time.
POD_READER_RULES: list[Manifest] = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}]


def render_router(plan: ServicePlan, settings: OperatorSettings) -> list[Manifest]:
    """Every router child, in this order: account, Role, RoleBinding (RBAC refuses a binding to
    a Role that does not exist yet), PDB, Deployment (its pods need the account and its rights)."""
    return [
        render_service_account(plan),
        render_role(plan),
        render_role_binding(plan),
        render_router_pdb(plan),
        render_router_deployment(plan, settings),
    ]


def router_metadata(plan: ServicePlan) -> Manifest:
    """The service's labels, but named as the router (never taken for a worker object)."""
    meta = metadata(plan, names.router_name(plan.name), COMPONENT)
    meta["labels"] = {**meta["labels"], **names.router_selector_labels(plan.name)}
    return meta


def render_service_account(plan: ServicePlan) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": router_metadata(plan),
        "automountServiceAccountToken": False,  # mounted by the router pod only
    }


def render_role(plan: ServicePlan) -> Manifest:
    return {
        "apiVersion": RBAC_API,
        "kind": "Role",
        "metadata": router_metadata(plan),
        "rules": POD_READER_RULES,
    }


def render_role_binding(plan: ServicePlan) -> Manifest:
    name = names.router_name(plan.name)
    return {
        "apiVersion": RBAC_API,
        "kind": "RoleBinding",
        "metadata": router_metadata(plan),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": plan.namespace}],
    }


def render_router_pdb(plan: ServicePlan) -> Manifest:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": router_metadata(plan),
        "spec": {
            "minAvailable": 1,  # a drain never takes both routers: the service stays reachable
            "selector": {"matchLabels": names.router_selector_labels(plan.name)},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def render_router_deployment(plan: ServicePlan, settings: OperatorSettings) -> Manifest:
    labels = {**names.common_labels(plan.name, plan.tier), **names.router_selector_labels(plan.name)}
    labels[names.LABEL_COMPONENT] = COMPONENT
    template: Manifest = {
        "metadata": {
            "labels": labels,
            "annotations": {names.ANNOTATION_CONFIG_HASH: content_hash(plan.router.to_yaml())},
        },
        "spec": _pod_spec(plan, settings),
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": router_metadata(plan),
        "spec": {
            "replicas": ROUTER_REPLICAS,
            "selector": {"matchLabels": names.router_selector_labels(plan.name)},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "revisionHistoryLimit": 3,
            "template": template,
        },
    }


def _pod_spec(plan: ServicePlan, settings: OperatorSettings) -> Manifest:
    spec: Manifest = {
        "serviceAccountName": names.router_name(plan.name),
        "automountServiceAccountToken": True,  # the in-cluster config it watches Pods with
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 30,
        "securityContext": pod_security_context(settings),
        # The tier's, as its workers: no worker of the same or a lower tier can preempt the
        # router its clients talk to, while a higher tier still comes first.
        "priorityClassName": plan.priority_class,
        # the cluster's own (not the GPU taint's): routers need no GPU node
        "tolerations": [dict(t) for t in settings.tolerations],
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": "kubernetes.io/hostname",
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {"matchLabels": names.router_selector_labels(plan.name)},
            }
        ],
        "containers": [_container(plan, settings)],
        "volumes": _volumes(plan),
    }
    if settings.router_node_selector:
        spec["nodeSelector"] = dict(settings.router_node_selector)
    secrets = pod_overrides(plan, settings).get("imagePullSecrets")
    if secrets:
        spec["imagePullSecrets"] = secrets  # the same image as the workers
    fetcher = model_fetcher(plan, settings) if plan.router.model.path else None
    if fetcher is not None:
        spec["initContainers"] = [{**fetcher, "volumeMounts": _mounts(plan)}]
    return spec


def _container(plan: ServicePlan, settings: OperatorSettings) -> Manifest:
    probe = {"httpGet": {"path": "/health", "port": "http"}, "timeoutSeconds": 2}
    return {
        "name": COMPONENT,
        "image": image(plan, settings),
        "imagePullPolicy": settings.image_pull_policy,
        "command": ["strata", "router", "serve", "--config", names.ROUTER_CONFIG_PATH],
        "args": LISTEN_ON_POD_IP,  # as the workers: on the local pod runtime pods share a host
        "ports": [{"name": "http", "containerPort": plan.router.port, "protocol": "TCP"}],
        "env": [*pod_env(), *api_key_env(plan)],  # POD_IP among pod_env's
        "resources": router_resources(plan, settings),
        "startupProbe": {**probe, "periodSeconds": 2, "failureThreshold": 60},
        "livenessProbe": {**probe, "periodSeconds": 10, "failureThreshold": 3},
        "readinessProbe": {**probe, "periodSeconds": 5, "failureThreshold": 2},
        "volumeMounts": _mounts(plan),
        "securityContext": container_security_context(),
    }


def router_resources(plan: ServicePlan, settings: OperatorSettings) -> Manifest:
    """The chart's router resources; where the plan says what following every replica's blocks
    takes and the chart's memory limit is less, that (as request and limit: followed keys are
    held for good, so a request below them is memory the node may not have)."""
    manifest: Manifest = settings.router_resources.manifest()
    need, limits = plan.router_memory_bytes, manifest.get("limits", {})
    if need is None or "memory" not in limits or parse_size(limits["memory"]) >= need:
        return manifest
    memory = bytes_quantity(need)
    requests = manifest.get("requests", {})
    return {**manifest, "requests": {**requests, "memory": memory}, "limits": {**limits, "memory": memory}}


def api_key_env(plan: ServicePlan) -> list[Manifest]:
    """The workers' API key, when the service sets it by name in ``spec.pod.env``: the router
    checks it at the door as the workers do. Only that variable: the router gets none of the
    tenant's other secrets (a key that comes in through ``envFrom`` stays the workers' alone)."""
    return [dict(e) for e in plan.pod.env if e.get("name") == API_KEY_ENV]


def _volumes(plan: ServicePlan) -> list[Manifest]:
    volumes: list[Manifest] = [
        {"name": "config", "configMap": {"name": names.configmap_name(plan.name)}},
        {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}},
    ]
    if plan.router.model.path:
        volumes.append(model_volume(plan))
    return volumes


def _mounts(plan: ServicePlan) -> list[Manifest]:
    mounts: list[Manifest] = [
        {"name": "config", "mountPath": names.CONFIG_DIR, "readOnly": True},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    if plan.router.model.path:
        mounts += [m for m in engine_mounts(plan) if m["name"] == "model"]
    return mounts
