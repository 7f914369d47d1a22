"""Finds the control-plane binaries, so every caller gets the same lookup order and error.

Order: ``KUBEBUILDER_ASSETS`` (envtest's convention, for users who already have binaries), then
``STRATA_BIN_DIR``, then ``<repo>/bin`` where ``make cluster-bins`` builds them. A directory is
chosen only if it holds every required binary, so a half-filled envtest directory (envtest ships
no scheduler, controller-manager or kwok) falls through to the next candidate.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

REQUIRED = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kwok",
)
OPTIONAL = ("helm",)
REPO_ROOT = Path(__file__).resolve().parents[2]


class MissingBinariesError(RuntimeError):
    """No candidate directory holds every control-plane binary."""


def candidate_dirs(env: Mapping[str, str], repo_root: Path | None = None) -> list[tuple[str, Path]]:
    """(source, directory) pairs in lookup order; unset variables are left out."""
    found = [(var, Path(env[var])) for var in ("KUBEBUILDER_ASSETS", "STRATA_BIN_DIR") if env.get(var)]
    return [*found, ("<repo>/bin", (repo_root or REPO_ROOT) / "bin")]


def missing_in(directory: Path, names: tuple[str, ...] = REQUIRED) -> list[str]:
    return [name for name in names if not os.access(directory / name, os.X_OK)]


def find_bin_dir(env: Mapping[str, str] | None = None, repo_root: Path | None = None) -> Path:
    """The first candidate directory holding every required binary, else a clear error."""
    candidates = candidate_dirs(os.environ if env is None else env, repo_root)
    problems = []
    for source, directory in candidates:
        missing = missing_in(directory)
        if not missing:
            return directory.resolve()
        problems.append(f"  {source}={directory}: missing {', '.join(missing)}")
    raise MissingBinariesError(
        "control-plane binaries not found; run `make cluster-bins` (builds them into <repo>/bin), "
        "or point KUBEBUILDER_ASSETS or STRATA_BIN_DIR at a directory holding "
        f"{', '.join(REQUIRED)}.\nLooked in:\n" + "\n".join(problems)
    )
