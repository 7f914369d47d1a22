"""strata.stack.local: the operator settings and the service resources that put pods on the
local node must be what the operator and the API accept, and must match the node's taint."""

from __future__ import annotations

from pathlib import Path

from strata.cluster.nodes import LOCAL_GPU_PRODUCT, LOCAL_TAINT
from strata.operator.api.models import InferenceService
from strata.operator.settings import settings_from_env
from strata.stack import inference_service, local_pods_env, local_resources


def test_the_operator_reads_a_toleration_of_the_local_nodes_taint(tmp_path: Path) -> None:
    settings = settings_from_env(local_pods_env(tmp_path / "nvme"))
    [toleration] = settings.tolerations
    assert {k: toleration[k] for k in ("key", "value", "effect")} == {
        k: LOCAL_TAINT[k] for k in ("key", "value", "effect")
    }
    assert settings.nvme_host_path == str(tmp_path / "nvme")


def test_without_a_directory_the_nvme_host_path_keeps_the_operators_default() -> None:
    assert "STRATA_NVME_HOST_PATH" not in local_pods_env()


def test_a_service_on_the_local_node_asks_for_its_product_and_no_gpu() -> None:
    manifest = inference_service("chat", "standard", resources=local_resources("250m", "1Gi"))
    service = InferenceService.model_validate(manifest)
    assert service.spec.resources.gpus == 0
    assert service.spec.resources.gpu_product == LOCAL_GPU_PRODUCT
