"""The worker pod template: engine container, KV-tier native sidecar, placement, hardening."""

from __future__ import annotations

import math

from strata.operator import names
from strata.operator.api.quantity import parse_quantity, quantity_fraction
from strata.operator.plan import ServicePlan
from strata.operator.render.common import Manifest, bytes_quantity
from strata.operator.render.configmap import config_hash
from strata.operator.render.vllm import vllm_api_key_env, vllm_args, vllm_command, vllm_env
from strata.operator.render.volumes import engine_mounts, render_volumes, sidecar_mounts
from strata.operator.settings import OperatorSettings
from strata.worker.config import DRAIN_CUTOFF_S

GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
LOCAL_NVME_LABEL = "strata.dev/local-nvme"
HOSTNAME_KEY = "kubernetes.io/hostname"
SIDECAR_CPU = "500m"
FETCHER_CPU, FETCHER_MEMORY, FETCHER_MEMORY_LIMIT = "500m", "1Gi", "4Gi"  # the model download's
# The engine and the sidecar listen on the pod IP (expanded by the kubelet from the POD_IP env var),
# where probes, scrapes and routers reach them, rather than on every address of the node: where
# pods share a network namespace (the test control plane's local nodes) two pods' ports collide.
LISTEN_ON_POD_IP = ["--host=$(POD_IP)"]
# Loading weights can take minutes; the startup probe holds liveness off for up to 15 minutes.
STARTUP_PROBE_BUDGET_S = 900
# The KV-tier sidecar stops after the engine has exited: close its stores, flush the NVMe index.
SIDECAR_STOP_S = 5.0


def render_pod_template(plan: ServicePlan, settings: OperatorSettings) -> Manifest:
    # The tenant's labels and annotations first: the operator's own keys always win.
    labels = {**plan.pod.labels, **names.common_labels(plan.name, plan.tier), names.LABEL_COMPONENT: "worker"}
    annotations = {**plan.pod.annotations, names.ANNOTATION_CONFIG_HASH: config_hash(plan)}
    spec: Manifest = {
        "priorityClassName": plan.priority_class,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": grace_period_s(plan),
        "securityContext": pod_security_context(settings),
        "nodeSelector": node_selector(plan),
        "tolerations": [*tolerations(settings), *plan.pod.tolerations],
        "topologySpreadConstraints": [topology_spread(plan)],
        "containers": [engine_container(plan, settings)],
        "volumes": render_volumes(plan, settings),
    }
    spec.update(pod_overrides(plan, settings))
    init = [c for c in (model_fetcher(plan, settings), kvtier_sidecar(plan, settings)) if c is not None]
    if init:
        spec["initContainers"] = init
    return {"metadata": {"labels": labels, "annotations": annotations}, "spec": spec}


def pod_overrides(plan: ServicePlan, settings: OperatorSettings) -> Manifest:
    """The pod-level settings of ``spec.pod`` that the operator has no value of its own for; image
    pull secrets are the operator's (chart ``worker.imagePullSecrets``) and then the service's."""
    pod = plan.pod
    out: Manifest = {}
    if pod.service_account_name:
        out["serviceAccountName"] = pod.service_account_name
    secrets = [{"name": name} for name in settings.image_pull_secrets]
    secrets += [s for s in pod.image_pull_secrets if s not in secrets]
    if secrets:
        out["imagePullSecrets"] = secrets
    if pod.affinity:
        out["affinity"] = pod.affinity
    return out


def tenant_env(plan: ServicePlan) -> Manifest:
    """``env`` (the operator's variables first) and ``envFrom`` of the containers that need the
    tenant's secrets: the engine and the model fetcher, not the KV-tier sidecar."""
    env: Manifest = {"env": [*pod_env(), *plan.pod.env]}
    if plan.pod.env_from:
        env["envFrom"] = list(plan.pod.env_from)
    return env


def grace_period_s(plan: ServicePlan) -> int:
    """SIGTERM to SIGKILL: the worker's drain (queue timeout + longest generation), the cut-off
    of whatever is still running after it, then the sidecar's stop."""
    return math.ceil(plan.worker.server.drain_timeout_s + DRAIN_CUTOFF_S + SIDECAR_STOP_S)


def engine_container(plan: ServicePlan, settings: OperatorSettings) -> Manifest:
    """Strata's worker, or vLLM's server (whose readiness is its /health: it has no /ready)."""
    container: Manifest = {
        "name": "engine",
        "image": engine_image(plan, settings),
        "imagePullPolicy": settings.image_pull_policy,
        "command": ["strata", "worker", "serve", "--config", names.CONFIG_PATH],
        "args": LISTEN_ON_POD_IP,
        "ports": [{"name": "http", "containerPort": plan.http_port, "protocol": "TCP"}],
        **tenant_env(plan),
        "resources": engine_resources(plan),
        "startupProbe": _http_probe("/health", "http", period_s=5, failures=STARTUP_PROBE_BUDGET_S // 5),
        "livenessProbe": _http_probe("/health", "http", period_s=10, failures=3),
        "readinessProbe": _http_probe("/ready", "http", period_s=5, failures=2),
        "volumeMounts": engine_mounts(plan),
        "securityContext": container_security_context(),
    }
    if plan.vllm:
        container["command"], container["args"] = vllm_command(plan), vllm_args(plan)
        container["env"] = [*pod_env(), *vllm_env(), *plan.pod.env, *vllm_api_key_env(plan)]
        container["readinessProbe"] = _http_probe("/health", "http", period_s=5, failures=2)
    return container


def engine_image(plan: ServicePlan, settings: OperatorSettings) -> str:
    return plan.image or (settings.vllm_image if plan.vllm else settings.worker_image)


def image(plan: ServicePlan, settings: OperatorSettings) -> str:
    """Strata's own image, for the model fetch and the KV-tier sidecar: the service's where its
    engine is Strata's worker."""
    return plan.image if plan.image and not plan.vllm else settings.worker_image


def model_fetcher(plan: ServicePlan, settings: OperatorSettings) -> Manifest | None:
    """An init container that fills the model emptyDir (download, or the built-in test model)
    before anything else starts; a PVC-backed model needs none."""
    source = plan.model_source
    if source.kind == "pvc" or source.uri is None:
        return None
    return {
        "name": "model",
        "image": image(plan, settings),
        "imagePullPolicy": settings.image_pull_policy,
        "command": [
            "strata",
            "worker",
            "fetch-model",
            "--source",
            source.uri,
            "--dest",
            plan.worker.model.path,
        ],
        **tenant_env(plan),
        "resources": fetcher_resources(plan),
        "volumeMounts": engine_mounts(plan),
        "securityContext": container_security_context(),
    }


def fetcher_resources(plan: ServicePlan) -> Manifest:
    """At most what the engine asks: a pod's request is the larger of its biggest init container
    and its running containers, so a download asking more would hold a node's CPU and memory,
    unused, for the pod's whole life (a 100m CPU worker counted as 500m)."""
    cpu, memory = FETCHER_CPU, FETCHER_MEMORY
    if plan.cpu and quantity_fraction(plan.cpu) < quantity_fraction(cpu):
        cpu = plan.cpu
    if plan.memory and parse_quantity(plan.memory) < parse_quantity(memory):
        memory = plan.memory
    return {"requests": {"cpu": cpu, "memory": memory}, "limits": {"memory": FETCHER_MEMORY_LIMIT}}


def kvtier_sidecar(plan: ServicePlan, settings: OperatorSettings) -> Manifest | None:
    """A native sidecar (init container with restartPolicy Always): it starts, and reports
    started, before the engine, and is stopped only after the engine has exited."""
    if not plan.kv_sidecar:
        return None
    memory_bytes = plan.worker.kvtier.memory_bytes
    assert memory_bytes is not None  # resolve sizes every sidecar it enables
    memory = bytes_quantity(memory_bytes)
    return {
        "name": "kvtier",
        "image": image(plan, settings),
        "imagePullPolicy": settings.image_pull_policy,
        "restartPolicy": "Always",
        "command": ["strata", "kvtier", "serve", "--config", names.CONFIG_PATH],
        "args": LISTEN_ON_POD_IP,
        "ports": [{"name": "kv-metrics", "containerPort": plan.kv_metrics_port, "protocol": "TCP"}],
        "env": pod_env(),
        # The DRAM tier's pages in /dev/shm are charged to the sidecar that writes them.
        "resources": {"requests": {"cpu": SIDECAR_CPU, "memory": memory}, "limits": {"memory": memory}},
        "startupProbe": _http_probe("/health", "kv-metrics", period_s=2, failures=60),
        "livenessProbe": _http_probe("/health", "kv-metrics", period_s=10, failures=3),
        "readinessProbe": _http_probe("/health", "kv-metrics", period_s=5, failures=2),
        "volumeMounts": sidecar_mounts(plan, settings),
        "securityContext": container_security_context(),
    }


def engine_resources(plan: ServicePlan) -> Manifest:
    # Extended resources must have requests equal to limits; 0 GPUs runs the worker on CPU.
    requests: dict[str, str] = {GPU_RESOURCE: str(plan.gpus)} if plan.gpus else {}
    limits: dict[str, str] = dict(requests)
    if plan.cpu:
        requests["cpu"] = plan.cpu  # no CPU limit: throttling the engine's scheduler loop hurts TTFT
    if plan.memory:
        requests["memory"] = limits["memory"] = plan.memory
    return {"requests": requests, "limits": limits}


def node_selector(plan: ServicePlan) -> dict[str, str]:
    selector: dict[str, str] = dict(plan.pod.node_selector)  # the GPU and NVMe labels win
    if plan.gpu_product:
        selector[GPU_PRODUCT_LABEL] = plan.gpu_product
    if plan.nvme is not None:
        selector[LOCAL_NVME_LABEL] = "true"
    return selector


def tolerations(settings: OperatorSettings) -> list[Manifest]:
    # GPU nodes are commonly tainted so that only GPU workloads land there.
    gpu = {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}
    return [gpu, *(dict(t) for t in settings.tolerations)]


def topology_spread(plan: ServicePlan) -> Manifest:
    # ScheduleAnyway: spreading is a preference. GPUs are scarce, and refusing to schedule a
    # replica because its node is already used would cost capacity rather than add resilience.
    return {
        "maxSkew": 1,
        "topologyKey": HOSTNAME_KEY,
        "whenUnsatisfiable": "ScheduleAnyway",
        "labelSelector": {"matchLabels": names.selector_labels(plan.name)},
    }


def pod_security_context(settings: OperatorSettings) -> Manifest:
    return {
        "runAsNonRoot": True,
        "runAsUser": settings.uid,
        "runAsGroup": settings.uid,
        "fsGroup": settings.uid,
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context() -> Manifest:
    return {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "privileged": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def pod_env() -> list[Manifest]:
    return [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    ]


def _http_probe(path: str, port: str, *, period_s: int, failures: int) -> Manifest:
    return {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": period_s,
        "failureThreshold": failures,
        "timeoutSeconds": 2,
    }
