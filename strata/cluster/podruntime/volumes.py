"""Filling a pod's volumes on this machine before its containers start.

emptyDir: a directory (``medium: Memory``: a tmpfs of ``sizeLimit``, mounted in the runtime's
private mount namespace, so it vanishes with the runtime); ConfigMap, Secret, downward API and
projected volumes (including a ServiceAccount token from the TokenRequest API, bound to the pod):
files written from the API; hostPath: the host's directory, created for DirectoryOrCreate;
claims: a directory per bound PersistentVolume under the runtime's directory.
"""

from __future__ import annotations

import base64
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from strata.cluster.podruntime import env as envs
from strata.cluster.podruntime import launch
from strata.cluster.podruntime.mounts import PodDirs, claim_name
from strata.cluster.podruntime.spec import (
    ConfigMapVolume,
    DownwardApiVolume,
    EmptyDirVolume,
    HostPathVolume,
    KeyToPath,
    Pod,
    ProjectionSource,
    TokenProjection,
    Volume,
)
from strata.operator.kube import KubeClient

TOKEN_MIN_EXPIRATION_S = 600


class VolumeError(RuntimeError):
    """A volume cannot be set up yet (missing ConfigMap, unbound claim): the kubelet's FailedMount."""


@dataclass
class VolumeContext:
    api: KubeClient
    facts: envs.PodFacts
    dirs: PodDirs
    claims_root: Path

    @property
    def pod(self) -> Pod:
        return self.facts.pod


def write_file(path: Path, data: bytes, mode: int | None = None) -> None:
    """Atomically, so a container reading the file never sees half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    tmp.chmod(mode if mode is not None else 0o644)
    tmp.replace(path)


def _data(obj: dict[str, Any], secret: bool) -> dict[str, bytes]:
    text = {k: (base64.b64decode(v) if secret else v.encode()) for k, v in (obj.get("data") or {}).items()}
    binary = {k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()}
    return {**text, **binary}


def _select(
    data: dict[str, bytes], items: tuple[KeyToPath, ...], what: str
) -> dict[str, tuple[bytes, int | None]]:
    if not items:
        return {key: (value, None) for key, value in data.items()}
    missing = [item.key for item in items if item.key not in data]
    if missing:
        raise VolumeError(f"{what}: no key {', '.join(missing)}")
    return {item.path: (data[item.key], item.mode) for item in items}


async def _keyed(ctx: VolumeContext, directory: Path, kind: str, source: ConfigMapVolume, name: str) -> None:
    plural = "configmaps" if kind == "configmap" else "secrets"
    obj = await ctx.api.read_path(f"/api/v1/namespaces/{ctx.pod.metadata.namespace}/{plural}/{name}")
    if obj is None:
        if source.optional:
            return
        raise VolumeError(f'{kind} "{name}" not found')
    for path, (data, mode) in _select(_data(obj, kind == "secret"), source.items, f'{kind} "{name}"').items():
        write_file(directory / path, data, mode or source.default_mode)


def _downward(ctx: VolumeContext, directory: Path, source: DownwardApiVolume) -> None:
    for item in source.items:
        if item.field_ref is not None:
            value = envs.field_value(item.field_ref.field_path, ctx.facts)
        elif item.resource_field_ref is not None:
            container = ctx.pod.container(item.resource_field_ref.container_name)
            value = envs.resource_value(item.resource_field_ref, container, ctx.facts)
        else:
            continue
        write_file(directory / item.path, value.encode())


async def _token(ctx: VolumeContext, directory: Path, source: TokenProjection) -> None:
    meta = ctx.pod.metadata
    spec: dict[str, Any] = {
        "expirationSeconds": max(source.expiration_seconds, TOKEN_MIN_EXPIRATION_S),
        "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": meta.name, "uid": meta.uid},
    }
    if source.audience:
        spec["audiences"] = [source.audience]
    account = ctx.pod.spec.service_account_name
    path = f"/api/v1/namespaces/{meta.namespace}/serviceaccounts/{account}/token"
    answer = await ctx.api.create_path(
        path, {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
    )
    write_file(directory / source.path, answer["status"]["token"].encode(), 0o600)


async def _projected(ctx: VolumeContext, directory: Path, sources: tuple[ProjectionSource, ...]) -> None:
    for source in sources:
        if source.service_account_token is not None:
            await _token(ctx, directory, source.service_account_token)
        if source.config_map is not None:
            await _keyed(ctx, directory, "configmap", source.config_map, source.config_map.name)
        if source.secret is not None:
            await _keyed(ctx, directory, "secret", source.secret, source.secret.name)
        if source.downward_api is not None:
            _downward(ctx, directory, source.downward_api)


def _empty_dir(directory: Path, source: EmptyDirVolume) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    if source.medium != "Memory" or os.path.ismount(directory):
        return
    size = int(envs.quantity(source.size_limit)) if source.size_limit else None
    options = f"size={size},mode=1777" if size else "mode=1777"
    try:
        launch.mount("tmpfs", str(directory), "tmpfs", launch.MS_NOSUID | launch.MS_NODEV, options)
    except OSError as error:
        raise VolumeError(f"tmpfs for volume {directory.name}: {error}") from None


def _host_path(source: HostPathVolume) -> None:
    path = Path(source.path)
    if source.type == "DirectoryOrCreate":
        path.mkdir(parents=True, exist_ok=True)
    elif source.type == "FileOrCreate":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(exist_ok=True)
    elif source.type in ("Directory", "File") and not path.exists():
        raise VolumeError(f"hostPath {path}: does not exist (type {source.type})")


async def _claim_dir(ctx: VolumeContext, claim: str) -> Path:
    namespace = ctx.pod.metadata.namespace
    obj = await ctx.api.read_path(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{claim}")
    if obj is None or (obj.get("status") or {}).get("phase") != "Bound":
        raise VolumeError(f"persistentvolumeclaim {claim}: not bound yet")
    return _ensure_dir(ctx.claims_root / str(obj["spec"]["volumeName"]))


def _ensure_dir(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    return directory


async def prepare(ctx: VolumeContext, volume: Volume) -> None:
    """Create or refresh one volume's contents (claims are resolved by ``claim_dirs``)."""
    directory = ctx.dirs.volume(volume.name)
    if volume.empty_dir is not None:
        _empty_dir(directory, volume.empty_dir)
    elif volume.config_map is not None:
        await _keyed(ctx, directory, "configmap", volume.config_map, volume.config_map.name)
    elif volume.secret is not None:
        secret = ConfigMapVolume(
            name=volume.secret.secret_name,
            items=volume.secret.items,
            optional=volume.secret.optional,
            default_mode=volume.secret.default_mode,
        )
        await _keyed(ctx, directory, "secret", secret, secret.name)
    elif volume.projected is not None:
        await _projected(ctx, directory, volume.projected.sources)
    elif volume.downward_api is not None:
        _downward(ctx, directory, volume.downward_api)
    elif volume.host_path is not None:
        _host_path(volume.host_path)


async def prepare_all(ctx: VolumeContext) -> dict[str, Path]:
    """Every volume of the pod; the directory of each claim it uses."""
    claims: dict[str, Path] = {}
    for volume in ctx.pod.spec.volumes:
        await prepare(ctx, volume)
        claim = claim_name(ctx.pod, volume)
        if claim is not None:
            claims[claim] = await _claim_dir(ctx, claim)
    return claims


def token_refresh_s(pod: Pod) -> float | None:
    """When the shortest-lived projected token should be renewed (80% of its life, as the kubelet)."""
    lives = [
        max(s.service_account_token.expiration_seconds, TOKEN_MIN_EXPIRATION_S)
        for v in pod.spec.volumes
        if v.projected is not None
        for s in v.projected.sources
        if s.service_account_token is not None
    ]
    return 0.8 * min(lives) if lives else None


def release(dirs: PodDirs) -> None:
    """Unmount a deleted pod's memory-backed volumes and remove its directory (logs stay)."""
    volumes = dirs.root / "volumes"
    if volumes.is_dir():
        for directory in volumes.iterdir():
            if os.path.ismount(directory):
                launch.unmount(str(directory))
    shutil.rmtree(dirs.root, ignore_errors=True)
