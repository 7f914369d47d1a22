"""What puts a service's pods on the local node, whose pods the local pod runtime runs for real.

The local node is tainted (KWOK's pretend pods stay the default) and says its GPUs are
``LOCAL_GPU_PRODUCT``: the operator has to render pods that tolerate the taint, and a service has
to ask for that product, with no GPU, so that its engine runs on this machine's CPU."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from strata.cluster.nodes import LOCAL_GPU_PRODUCT, LOCAL_TOLERATION


def local_pods_env(nvme_host_path: Path | None = None) -> dict[str, str]:
    """Operator settings for pods that may land on the local node; ``nvme_host_path`` gives the
    NVMe tier's hostPath a directory of the caller's (a test's own), not the shared default."""
    env = {"STRATA_TOLERATIONS": json.dumps([LOCAL_TOLERATION])}
    if nvme_host_path is not None:
        env["STRATA_NVME_HOST_PATH"] = str(nvme_host_path)
    return env


def local_resources(cpu: str, memory: str) -> dict[str, Any]:
    """An InferenceService's ``spec.resources`` for the local node: no GPU, ``cpu`` and ``memory``
    requested (what the local node offers is the machine's own cores and memory)."""
    return {"gpus": 0, "gpuProduct": LOCAL_GPU_PRODUCT, "cpu": cpu, "memory": memory}
