"""What every pod on this runtime shares: the API client, the probe HTTP session, the runtime's
directories, and the environment its containers start from (the "image" is this checkout)."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from strata.cluster.nodes import NODE_IP
from strata.cluster.podruntime.images import Images
from strata.cluster.podruntime.mounts import IMAGE_CODE
from strata.operator.kube import KubeClient

HOST_IP = NODE_IP
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The runtime stops its containers within this when it is itself stopped (the cluster's
# component stop allows 10 s before SIGKILL).
SHUTDOWN_GRACE_S = 5.0
# The kubelet never gives a container less than this to stop, whatever the grace period says.
MIN_GRACE_S = 2.0


def image_env(api_port: int) -> dict[str, str]:
    """The environment a container starts from. No image is pulled: the project's virtualenv is
    first on PATH, so ``strata ...`` runs this checkout (mounted at IMAGE_CODE, on PYTHONPATH),
    and the API server is reachable where in-cluster clients look for it."""
    return {
        "PATH": f"{Path(sys.executable).parent}:{SYSTEM_PATH}",
        "PYTHONPATH": IMAGE_CODE,
        "HOME": os.environ.get("HOME", "/root"),
        "KUBERNETES_SERVICE_HOST": HOST_IP,
        "KUBERNETES_SERVICE_PORT": str(api_port),
        "KUBERNETES_SERVICE_PORT_HTTPS": str(api_port),
        "KUBERNETES_PORT": f"tcp://{HOST_IP}:{api_port}",
    }


@dataclass
class Host:
    api: KubeClient
    repo_root: Path  # the checkout the containers run
    root: Path  # <cluster>/pod-runtime: pods/<key>/ (volumes, launch specs), claims/<pv>/
    logs: Path  # <cluster>/logs/pods: <key>/<container>/<n>.log
    images: Images
    kubelet_port: int = 0  # where the runtime serves the kubelet's log endpoint (0: it does not)
    session: aiohttp.ClientSession = field(default_factory=aiohttp.ClientSession)

    @property
    def pods(self) -> Path:
        return self.root / "pods"

    @property
    def claims(self) -> Path:
        return self.root / "claims"


@dataclass(frozen=True)
class Node:
    name: str
    pod_cidr: str
    allocatable: dict[str, str]
