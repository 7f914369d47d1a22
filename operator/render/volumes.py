"""The pod's volumes and where each container mounts them.

Both containers share the config, the sidecar socket directory and the memory-backed /dev/shm
that holds the DRAM tier; only the sidecar mounts the NVMe and shared-storage tiers; only the
engine mounts the model."""

from __future__ import annotations

from typing import Literal

from strata.common.kvbudget import KVTIER_STAGING_BYTES
from strata.operator import names
from strata.operator.plan import ServicePlan
from strata.operator.render.common import Manifest, bytes_quantity
from strata.operator.settings import OperatorSettings

MODEL_DIR = "/models"
# Headroom above the DRAM tier for what the engine itself puts in /dev/shm (e.g. torch IPC).
SHM_HEADROOM_BYTES = 256 * 2**20
# A vLLM engine's tensor-parallel workers exchange through /dev/shm (NCCL's and vLLM's shared
# buffers): this much more per GPU of a replica with several.
TP_SHM_BYTES_PER_GPU = 2**30
# /tmp: vLLM's caches (compiled kernels, torch.compile's) live there, as its HOME.
TMP_SIZE, VLLM_TMP_SIZE = "1Gi", "8Gi"
NVME_VOLUME = "nvme"
# Each pod gets its own directory on the node so replicas (and tenants) never share one.
HOST_PATH_SUBDIR = "$(POD_NAMESPACE)/$(POD_NAME)"


def shm_size_bytes(plan: ServicePlan) -> int:
    """The DRAM tier, the sidecar's staging slots beside it, and the engine's own use."""
    staging = KVTIER_STAGING_BYTES if plan.kv_sidecar else 0
    tensor_parallel = TP_SHM_BYTES_PER_GPU * plan.gpus if plan.vllm and plan.gpus > 1 else 0
    return plan.dram_bytes + staging + SHM_HEADROOM_BYTES + tensor_parallel


def nvme_claim_spec(plan: ServicePlan) -> Manifest:
    assert plan.nvme is not None
    spec: Manifest = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": bytes_quantity(plan.nvme.size_bytes)}},
    }
    if plan.nvme.storage_class:
        spec["storageClassName"] = plan.nvme.storage_class
    return spec


NvmeSource = Literal["claimTemplate", "ephemeral", "hostPath", "emptyDir"]


def nvme_source(plan: ServicePlan, settings: OperatorSettings) -> NvmeSource | None:
    """Where the NVMe tier lives: a provisioned volume (a StatefulSet's claim template where it
    persists, else a generic ephemeral volume), or the node's directory. Where the namespace's Pod
    Security level refuses hostPath, the node's directory is an emptyDir on the node's disk
    instead: kept across container restarts, not past the pod, its size bounded by the sidecar's
    capacity alone (as the directory's). None: no NVMe tier."""
    if plan.nvme is None:
        return None
    if settings.nvme_volume == "hostPath":
        return "hostPath" if plan.host_path_allowed else "emptyDir"
    return "claimTemplate" if plan.nvme.persistent else "ephemeral"


def uses_claim_template(plan: ServicePlan, settings: OperatorSettings) -> bool:
    """A persistent NVMe tier on a provisioned volume lives in a StatefulSet claim template."""
    return nvme_source(plan, settings) == "claimTemplate"


def render_volumes(plan: ServicePlan, settings: OperatorSettings) -> list[Manifest]:
    volumes: list[Manifest] = [
        {"name": "config", "configMap": {"name": names.configmap_name(plan.name)}},
        {"name": "run", "emptyDir": {"sizeLimit": "16Mi"}},
        {"name": "tmp", "emptyDir": {"sizeLimit": VLLM_TMP_SIZE if plan.vllm else TMP_SIZE}},
        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": bytes_quantity(shm_size_bytes(plan))}},
        model_volume(plan),
    ]
    nvme = _nvme_volume(plan, settings)
    if nvme is not None:
        volumes.append(nvme)
    if plan.shared is not None:
        volumes.append({"name": "shared", "persistentVolumeClaim": {"claimName": plan.shared.claim_name}})
    return volumes


def model_volume(plan: ServicePlan) -> Manifest:
    source = plan.model_source
    if source.kind == "pvc":
        return {"name": "model", "persistentVolumeClaim": {"claimName": source.claim_name, "readOnly": True}}
    return {"name": "model", "emptyDir": {}}


def _nvme_volume(plan: ServicePlan, settings: OperatorSettings) -> Manifest | None:
    source = nvme_source(plan, settings)
    if source is None or source == "claimTemplate":
        return None
    if source == "hostPath":
        return {
            "name": NVME_VOLUME,
            "hostPath": {"path": settings.nvme_host_path, "type": "DirectoryOrCreate"},
        }
    if source == "emptyDir":  # as the host directory, no size limit: past one the pod is evicted
        return {"name": NVME_VOLUME, "emptyDir": {}}
    return {
        "name": NVME_VOLUME,
        "ephemeral": {
            "volumeClaimTemplate": {
                "metadata": {"labels": names.selector_labels(plan.name)},
                "spec": nvme_claim_spec(plan),
            }
        },
    }


def shared_mounts() -> list[Manifest]:
    return [
        {"name": "config", "mountPath": names.CONFIG_DIR, "readOnly": True},
        {"name": "run", "mountPath": "/run/strata"},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "shm", "mountPath": "/dev/shm"},
    ]


def engine_mounts(plan: ServicePlan) -> list[Manifest]:
    model: Manifest = {"name": "model", "mountPath": MODEL_DIR}
    if plan.model_source.kind == "pvc":
        model["readOnly"] = True
        if plan.model_source.sub_path:
            model["subPath"] = plan.model_source.sub_path
    return [*shared_mounts(), model]


def sidecar_mounts(plan: ServicePlan, settings: OperatorSettings) -> list[Manifest]:
    mounts = shared_mounts()
    if plan.nvme is not None:
        nvme: Manifest = {"name": NVME_VOLUME, "mountPath": plan.worker.kvtier.nvme.path}
        if nvme_source(plan, settings) == "hostPath":
            nvme["subPathExpr"] = HOST_PATH_SUBDIR
        mounts.append(nvme)
    if plan.shared is not None:
        mounts.append({"name": "shared", "mountPath": plan.worker.kvtier.shared.path})
    return mounts
