"""Where each of a container's volume mounts comes from on this machine (pure).

Every volume of a pod is a directory under the pod's directory (``volumes/<name>``), except a
hostPath (the host's path itself) and a claim (a directory per PersistentVolume, shared by the
pods that use it). The launcher bind-mounts each source at the container's ``mountPath`` in the
container's private mount namespace, so the container sees the paths its spec names.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from strata.cluster.podruntime.env import ContainerConfigError, expand
from strata.cluster.podruntime.spec import Container, Pod, Volume

# Where every container finds the checkout the runtime runs (its PYTHONPATH).
IMAGE_CODE = "/opt/strata"
# ConfigMap, Secret, projected and downward-API volumes are read-only, as the kubelet mounts them.
READ_ONLY_KINDS = ("config_map", "secret", "projected", "downward_api")


@dataclass(frozen=True)
class Mount:
    source: str
    target: str
    read_only: bool
    # A subPath: the kubelet creates the directory in the volume when it is missing.
    make_source: bool = False


@dataclass(frozen=True)
class PodDirs:
    """One pod's directories: its volumes, and its containers' logs (kubelet-like layout)."""

    root: Path
    logs: Path

    def volume(self, name: str) -> Path:
        return self.root / "volumes" / name

    def log(self, container: str, start: int) -> Path:
        return self.logs / container / f"{start}.log"


def volume_kind(volume: Volume) -> str:
    for kind in ("empty_dir", *READ_ONLY_KINDS, "host_path", "persistent_volume_claim", "ephemeral"):
        if getattr(volume, kind) is not None:
            return kind
    raise ContainerConfigError(f"volume {volume.name}: no source the local pod runtime supports")


def claim_name(pod: Pod, volume: Volume) -> str | None:
    """The claim behind a volume: its own, or the one the ephemeral-volume controller made."""
    if volume.persistent_volume_claim is not None:
        return volume.persistent_volume_claim.claim_name
    if volume.ephemeral is not None:
        return f"{pod.metadata.name}-{volume.name}"
    return None


def volume_source(pod: Pod, volume: Volume, dirs: PodDirs, claim_dirs: Mapping[str, Path]) -> str:
    if volume.host_path is not None:
        return volume.host_path.path
    claim = claim_name(pod, volume)
    if claim is not None:
        if claim not in claim_dirs:
            raise ContainerConfigError(f"volume {volume.name}: claim {claim} is not bound")
        return str(claim_dirs[claim])
    return str(dirs.volume(volume.name))


def _sub_path(container: Container, mount_sub: str, expr: str, env: Mapping[str, str]) -> str:
    sub = expand(expr, env) if expr else mount_sub
    if sub.startswith("/") or ".." in sub.split("/"):
        raise ContainerConfigError(
            f"container {container.name}: subPath {sub!r} must be relative, without '..'"
        )
    return sub


def container_mounts(
    pod: Pod, container: Container, dirs: PodDirs, env: Mapping[str, str], claim_dirs: Mapping[str, Path]
) -> list[Mount]:
    mounts = []
    for mount in container.volume_mounts:
        volume = pod.volume(mount.name)
        source = volume_source(pod, volume, dirs, claim_dirs)
        sub = _sub_path(container, mount.sub_path, mount.sub_path_expr, env)
        read_only = mount.read_only or volume_kind(volume) in READ_ONLY_KINDS
        if volume.persistent_volume_claim is not None and volume.persistent_volume_claim.read_only:
            read_only = True
        target = posixpath.normpath(mount.mount_path)
        mounts.append(Mount(posixpath.join(source, sub) if sub else source, target, read_only, bool(sub)))
    return mounts


def environment_mounts(directories: Sequence[Path]) -> list[Mount]:
    """The image's environment where it is, read-only, after the pod's volumes (a mount is made
    after those of shorter paths): a volume at /tmp does not hide a virtualenv under /tmp."""
    return [Mount(str(d), str(d), read_only=True) for d in directories]


def image_mount(repo_root: str) -> Mount:
    """The "image": this checkout, read-only at ``IMAGE_CODE`` in every container, whatever the
    container mounts elsewhere (a volume at /tmp must not hide a checkout that lives under /tmp)."""
    return Mount(repo_root, IMAGE_CODE, read_only=True)
