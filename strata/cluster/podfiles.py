"""Reading what the local pod runtime leaves on disk: a container's log and its process.

For tests, people and the runtime's kubelet endpoint (``kubectl logs`` reads them through it):
logs are ``<cluster>/logs/pods/<namespace>_<pod>_<uid>/<container>/<restartCount>.log`` and
each running container's shim pid is in ``<cluster>/pod-runtime/pods/<key>/containers/<name>.json``.
"""

from __future__ import annotations

import json
from pathlib import Path


def pod_dir(root: Path, namespace: str, pod: str) -> Path | None:
    """The newest directory of ``namespace/pod`` under ``root`` (a pod name can be reused)."""
    found = sorted(root.glob(f"{namespace}_{pod}_*"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def container_log(logs_root: Path, namespace: str, pod: str, container: str, previous: bool = False) -> str:
    """The current (or, with ``previous``, the one before) run's output; "" when there is none."""
    directory = pod_dir(logs_root, namespace, pod)
    if directory is None:
        return ""
    runs = container_runs(directory / container)
    wanted = runs[-2:-1] if previous else runs[-1:]
    return wanted[0].read_text(errors="replace") if wanted else ""


def container_runs(directory: Path) -> list[Path]:
    """A container's log files, one per run, oldest first."""
    return sorted(directory.glob("*.log"), key=lambda p: int(p.stem))


def container_pid(state_root: Path, namespace: str, pod: str, container: str) -> int | None:
    """The pid (as this host numbers it) of the container's own process, PID 1 of its namespace."""
    directory = pod_dir(state_root, namespace, pod)
    if directory is None:
        return None
    try:
        shim = json.loads((directory / "containers" / f"{container}.json").read_text())["shim"]
        children = Path(f"/proc/{shim}/task/{shim}/children").read_text().split()
    except (OSError, ValueError, KeyError):
        return None
    return int(children[0]) if children else None
