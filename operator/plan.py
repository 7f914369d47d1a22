"""The resolved plan of one InferenceService: everything rendering needs, already decided.

``resolve`` (in ``strata.operator.resolve``) turns an InferenceService and its ServiceTier into
a :class:`ServicePlan`; every ``render_*`` function reads only the plan and the operator
settings. Keeping the plan frozen and free of API types makes rendering trivially testable."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from strata.router.config import RouterConfig
from strata.worker.config import WorkerConfig

ModelSourceKind = Literal["pvc", "uri", "builtin"]


@dataclass(frozen=True)
class ModelSource:
    """Where the weights come from. ``pvc``: a claim mounted read-only; ``uri`` and ``builtin``:
    an emptyDir the worker fills on start (download, or the built-in test model)."""

    kind: ModelSourceKind
    claim_name: str | None = None
    sub_path: str | None = None
    uri: str | None = None


@dataclass(frozen=True)
class NvmePlan:
    size_bytes: int
    storage_class: str | None
    # Survives pod restarts: the workload becomes a StatefulSet with a claim template.
    persistent: bool


@dataclass(frozen=True)
class SharedPlan:
    """A ReadWriteMany claim per service, shared by its replicas."""

    claim_name: str
    size_bytes: int
    storage_class: str | None


@dataclass(frozen=True)
class OwnerRef:
    api_version: str
    kind: str
    name: str
    uid: str


@dataclass(frozen=True)
class PodPlan:
    """The tenant's ``spec.pod``, as Kubernetes manifest fragments (camelCase, no nulls)."""

    env: tuple[dict[str, Any], ...] = ()
    env_from: tuple[dict[str, Any], ...] = ()
    image_pull_secrets: tuple[dict[str, Any], ...] = ()
    service_account_name: str | None = None
    annotations: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    node_selector: dict[str, str] = field(default_factory=dict)
    affinity: dict[str, Any] | None = None
    tolerations: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class ServicePlan:
    name: str
    namespace: str
    owner: OwnerRef
    tier: str
    priority_class: str
    replicas: int
    min_replicas: int
    gpus: int
    gpu_product: str | None
    cpu: str | None
    memory: str | None
    dram_bytes: int
    nvme: NvmePlan | None
    shared: SharedPlan | None
    model_source: ModelSource
    image: str | None
    worker: WorkerConfig
    router: RouterConfig
    pod: PodPlan = PodPlan()
    # `spec.engine.vllm.args`: passed through after the flags the operator renders.
    engine_args: tuple[str, ...] = ()
    # The routers' memory to follow every replica's cached blocks; None: the chart's as it is.
    router_memory_bytes: int | None = None
    # False in a namespace whose Pod Security level refuses hostPath volumes: a hostPath NVMe
    # tier becomes an emptyDir there (``render.volumes.nvme_source``).
    host_path_allowed: bool = True

    @property
    def vllm(self) -> bool:
        return self.worker.engine.kind == "vllm"

    @property
    def kv_sidecar(self) -> bool:
        """The KV-tier sidecar runs where there are lower tiers, and beside every vLLM engine
        (it relays the engine's KV events to the routers, tiers or not)."""
        return self.worker.kvtier.enabled or self.vllm

    @property
    def workload_kind(self) -> Literal["Deployment", "StatefulSet"]:
        return "StatefulSet" if self.nvme is not None and self.nvme.persistent else "Deployment"

    @property
    def http_port(self) -> int:
        return self.worker.server.port

    @property
    def kv_metrics_port(self) -> int:
        return self.worker.kvtier.metrics_port
