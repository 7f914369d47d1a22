"""``strata worker fetch-model``: fill the model directory before the engine starts.

The operator renders this as the pod's first init container for every model source but a PVC.
Sources: ``builtin://<preset>`` (the seeded test models), ``hf://org/name[@revision]`` (the
Hugging Face hub, through huggingface_hub; ``HF_TOKEN`` for gated models), ``http(s)://`` (a
directory served over HTTP) and public ``s3://`` and ``gs://`` buckets read over HTTPS.
Credentials for private buckets are not supported yet: use a PVC for those.

Only what the engine needs comes down: config and tokenizer files, the chat template, and the
weight shards the index names (``include`` adds files, ``exclude`` drops them). Every source
resumes: a restarted init container keeps whole files, continues partial ones and fetches only
what is missing. A finished fetch writes a marker naming its source, so a pod that keeps its
volume does not even look again; a directory last filled from another source is cleared first.
"""

from __future__ import annotations

import fnmatch
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from strata.worker.fetch_http import FetchError, HttpSource, download, resolve_http
from strata.worker.fetch_progress import Progress

MARKER = ".strata-fetched"  # the source, once everything is in place
SOURCE = ".strata-source"  # the source being fetched into this directory
REQUIRED = ("config.json",)
OPTIONAL = (
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)
SINGLE_WEIGHTS = "model.safetensors"
SHARD_INDEX = "model.safetensors.index.json"
MODEL_FILES = ("*.json", "*.safetensors", "*.jinja", "*.part", "tokenizer*")


@dataclass(frozen=True)
class FetchOptions:
    include: tuple[str, ...] = ()  # more files (hf: glob patterns; http: exact names)
    exclude: tuple[str, ...] = ()  # glob patterns of files not to fetch
    workers: int = 8  # files downloaded at once


def fetch_model(uri: str, dest: str | Path, options: FetchOptions = FetchOptions()) -> Path:
    """Fetch ``uri`` into ``dest`` unless it already holds a finished fetch of the same source."""
    out = Path(dest)
    out.mkdir(parents=True, exist_ok=True)
    marker = out / MARKER
    if marker.is_file() and marker.read_text() == uri:
        return out
    _claim(out, uri)
    if uri.startswith("builtin://"):
        _fetch_builtin(uri.removeprefix("builtin://").strip("/"), out)
    elif uri.startswith("hf://"):
        from strata.worker.fetch_hf import fetch_hf

        fetch_hf(uri, out, options.include, options.exclude, options.workers)
    else:
        _fetch_http(resolve_http(uri), out, options)
    _validate(uri, out)
    marker.write_text(uri)
    return out


def _claim(out: Path, uri: str) -> None:
    """Files from another source must not pass for this one's (they would be skipped as whole)."""
    source, marker = out / SOURCE, out / MARKER
    previous = source.read_text() if source.is_file() else None
    marker.unlink(missing_ok=True)
    if previous is not None and previous != uri:
        for path in out.iterdir():
            if path.is_file() and any(fnmatch.fnmatch(path.name, p) for p in MODEL_FILES):
                path.unlink()
    source.write_text(uri)


def _fetch_builtin(preset: str, out: Path) -> None:
    from strata.worker.models.presets import PRESETS, write_model

    if preset not in PRESETS:
        raise FetchError(
            f"source builtin://{preset}: unknown built-in model; choose one of {sorted(PRESETS)}"
        )
    write_model(out, preset)


def _kept(names: list[str], options: FetchOptions) -> list[str]:
    return [n for n in names if not any(fnmatch.fnmatch(n, p) for p in options.exclude)]


def _fetch_http(source: HttpSource, out: Path, options: FetchOptions) -> None:
    progress = Progress(source.uri)

    def get(name: str, required: bool) -> bool:
        found = download(source, name, out, progress, required=required)
        if found and not required:
            progress.expect(1)  # an optional file counts once it turns out to exist
        return found

    get(REQUIRED[0], True)  # first: a wrong source fails on the file that must be there
    with ThreadPoolExecutor(options.workers, thread_name_prefix="fetch") as pool:
        optional = _kept([*OPTIONAL, *options.include], options)
        metadata = [pool.submit(get, name, name in options.include) for name in optional]
        has_index = get(SHARD_INDEX, False)
        weights = _kept(_shards(out, source) if has_index else [SINGLE_WEIGHTS], options)
        progress.expect(len(weights) + 1)  # and config.json
        for future in [*metadata, *(pool.submit(get, name, True) for name in weights)]:
            future.result()  # the first failure ends the fetch; whole files stay for the next run
    progress.finished()


def _shards(out: Path, source: HttpSource) -> list[str]:
    index = json.loads((out / SHARD_INDEX).read_text())
    shards = sorted(set(index.get("weight_map", {}).values()))
    if not shards:
        raise FetchError(f"source {source.uri!r}: {SHARD_INDEX} lists no weight files")
    return shards


def _validate(uri: str, out: Path) -> None:
    """Fail the init container, not the engine, when what arrived is not a loadable model."""
    from strata.worker.models.registry import read_config

    try:
        read_config(out)
    except Exception as exc:
        raise FetchError(f"source {uri!r}: fetched files are not a model: {exc}") from exc
