"""``strata worker fetch-model``: fill the model directory before the engine starts.

The operator renders this as the pod's first init container for every model source but a PVC.
Sources: ``builtin://<preset>`` (the seeded test models), ``http(s)://`` (a directory served over
HTTP), ``hf://org/name[@revision]`` (the Hugging Face hub layout), and public ``s3://`` and
``gs://`` buckets read over HTTPS. Credentials for private buckets are not supported yet: use a
PVC for those. A finished fetch writes a marker naming its source, so an init container that is
restarted (or a pod that keeps its volume) does not fetch twice, and a half-written directory is
never taken for a model.
"""

from __future__ import annotations

import json
import os
import shutil
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

MARKER = ".strata-fetched"
REQUIRED = ("config.json",)
OPTIONAL = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")
SINGLE_WEIGHTS = "model.safetensors"
SHARD_INDEX = "model.safetensors.index.json"
CHUNK_BYTES = 8 * 2**20


class FetchError(RuntimeError):
    """The source cannot be fetched; the message names the source and the reason."""


@dataclass(frozen=True)
class HttpSource:
    base_url: str  # ends with "/"
    headers: tuple[tuple[str, str], ...] = ()


def resolve_http(uri: str, env: dict[str, str] | None = None) -> HttpSource:
    """Map a model URI onto the HTTP directory it is read from (pure; ``env`` for endpoints)."""
    env = dict(os.environ) if env is None else env
    scheme, _, rest = uri.partition("://")
    rest = rest.strip("/")
    if not rest:
        raise FetchError(f"source {uri!r}: empty location after {scheme}://")
    if scheme in ("http", "https"):
        return HttpSource(f"{scheme}://{rest}/")
    if scheme == "hf":
        repo, _, revision = rest.partition("@")
        endpoint = env.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
        token = env.get("HF_TOKEN")
        headers = (("Authorization", f"Bearer {token}"),) if token else ()
        return HttpSource(f"{endpoint}/{repo}/resolve/{revision or 'main'}/", headers)
    if scheme == "s3":
        bucket, _, prefix = rest.partition("/")
        s3_endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
        if s3_endpoint:  # path-style, as MinIO and other S3-compatible stores expect
            return HttpSource(f"{s3_endpoint.rstrip('/')}/{bucket}/{_dir(prefix)}")
        return HttpSource(f"https://{bucket}.s3.amazonaws.com/{_dir(prefix)}")
    if scheme == "gs":
        bucket, _, prefix = rest.partition("/")
        endpoint = env.get("STORAGE_EMULATOR_HOST", "https://storage.googleapis.com").rstrip("/")
        return HttpSource(f"{endpoint}/{bucket}/{_dir(prefix)}")
    raise FetchError(f"source {uri!r}: unsupported scheme {scheme!r} (builtin, http, https, hf, s3, gs)")


def _dir(prefix: str) -> str:
    return f"{prefix.strip('/')}/" if prefix.strip("/") else ""


def fetch_model(uri: str, dest: str | Path) -> Path:
    """Fetch ``uri`` into ``dest`` unless it already holds a finished fetch of the same source."""
    out = Path(dest)
    out.mkdir(parents=True, exist_ok=True)
    marker = out / MARKER
    if marker.exists() and marker.read_text() == uri:
        return out
    marker.unlink(missing_ok=True)
    if uri.startswith("builtin://"):
        _fetch_builtin(uri.removeprefix("builtin://").strip("/"), out)
    else:
        _fetch_http(resolve_http(uri), uri, out)
    _validate(uri, out)
    marker.write_text(uri)
    return out


def _fetch_builtin(preset: str, out: Path) -> None:
    from strata.worker.models.presets import PRESETS, write_model

    if preset not in PRESETS:
        raise FetchError(
            f"source builtin://{preset}: unknown built-in model; choose one of {sorted(PRESETS)}"
        )
    write_model(out, preset)


def _fetch_http(source: HttpSource, uri: str, out: Path) -> None:
    for name in REQUIRED:
        _download(source, name, out, uri, required=True)
    for name in OPTIONAL:
        _download(source, name, out, uri, required=False)
    if _download(source, SHARD_INDEX, out, uri, required=False):
        index = json.loads((out / SHARD_INDEX).read_text())
        shards = sorted(set(index.get("weight_map", {}).values()))
        if not shards:
            raise FetchError(f"source {uri!r}: {SHARD_INDEX} lists no weight files")
        for shard in shards:
            _download(source, shard, out, uri, required=True)
    else:
        _download(source, SINGLE_WEIGHTS, out, uri, required=True)


def _download(source: HttpSource, name: str, out: Path, uri: str, *, required: bool) -> bool:
    """Stream one file to ``name.part``, then rename: a crash never leaves a truncated file."""
    if "/" in name or name.startswith("."):
        raise FetchError(f"source {uri!r}: refusing file name {name!r} from the shard index")
    request = urllib.request.Request(source.base_url + urllib.parse.quote(name), headers=dict(source.headers))
    part = out / f"{name}.part"
    try:
        with urllib.request.urlopen(request, timeout=60) as response, part.open("wb") as sink:
            shutil.copyfileobj(response, sink, CHUNK_BYTES)
    except urllib.error.HTTPError as exc:
        part.unlink(missing_ok=True)
        if exc.code == 404 and not required:
            return False
        raise FetchError(f"source {uri!r}: GET {name} answered HTTP {exc.code} {exc.reason}") from exc
    except (urllib.error.URLError, OSError) as exc:
        part.unlink(missing_ok=True)
        raise FetchError(f"source {uri!r}: GET {name} failed: {exc}") from exc
    part.replace(out / name)
    return True


def _validate(uri: str, out: Path) -> None:
    """Fail the init container, not the engine, when what arrived is not a loadable model."""
    from strata.worker.models.loader import read_config

    try:
        read_config(out)
    except Exception as exc:
        raise FetchError(f"source {uri!r}: fetched files are not a model: {exc}") from exc
