"""Model files from the Hugging Face hub (``hf://org/name[@revision]``) through huggingface_hub.

huggingface_hub resumes interrupted files, skips complete ones (it keeps their metadata under
``.cache/huggingface`` in the destination), downloads in parallel and reads ``HF_TOKEN`` (gated
models) and ``HF_ENDPOINT`` (a mirror). We choose the files: the model's metadata first, then only
the weight shards its index names, so a repository that also ships ``.bin``, ``.pth``, GGUF or
``consolidated.safetensors`` copies brings down one copy. Its progress bars become log lines.
"""

from __future__ import annotations

import fnmatch
import io
import json
import os
from pathlib import Path
from typing import Any

from strata.worker.fetch_http import FetchError
from strata.worker.fetch_progress import Progress

METADATA = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "model.safetensors.index.json",
)


def parse_hf(uri: str) -> tuple[str, str | None]:
    repo, _, revision = uri.removeprefix("hf://").strip("/").partition("@")
    if repo.count("/") != 1 or not all(repo.split("/")):
        raise FetchError(f"source {uri!r}: expected hf://<org>/<name>[@revision]")
    return repo, revision or None


def weight_patterns(out: Path) -> list[str]:
    """The shards the index names, else the single-file checkpoint."""
    index = out / "model.safetensors.index.json"
    if not index.is_file():
        return ["model.safetensors"]
    return sorted(set(json.loads(index.read_text()).get("weight_map", {}).values()))


def selected(names: list[str], include: tuple[str, ...], exclude: tuple[str, ...]) -> list[str]:
    """``names`` plus the ``include`` patterns, minus anything matching an ``exclude`` one."""
    wanted = [*names, *include]
    return [n for n in wanted if not any(fnmatch.fnmatch(n, p) for p in exclude)]


def _progress_class(progress: Progress) -> type[Any]:
    """A tqdm that reports into our log lines instead of drawing bars."""
    from tqdm.auto import tqdm

    class LogTqdm(tqdm):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["disable"] = False  # counting needs an enabled bar; it draws into nothing
            kwargs["file"] = io.StringIO()
            super().__init__(*args, **kwargs)

        def update(self, n: float | None = 1) -> bool | None:
            if n and self.unit == "B":
                progress.add(int(n))
            return super().update(n)  # type: ignore[no-any-return]

    return LogTqdm


def fetch_hf(uri: str, out: Path, include: tuple[str, ...], exclude: tuple[str, ...], workers: int) -> None:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError

    repo, revision = parse_hf(uri)
    progress = Progress(uri)
    bars = _progress_class(progress)

    def get(patterns: list[str]) -> None:
        snapshot_download(
            repo,
            revision=revision,
            local_dir=out,
            allow_patterns=patterns,
            max_workers=workers,
            tqdm_class=bars,
            # huggingface_hub reads HF_ENDPOINT once, when first imported (which transformers,
            # say, may have done before the variable was set): read it at each fetch instead.
            endpoint=os.environ.get("HF_ENDPOINT") or None,
        )

    try:
        get(selected(list(METADATA), include, exclude))
        get(selected(weight_patterns(out), (), exclude))
    except (HfHubHTTPError, OSError) as exc:
        raise FetchError(f"source {uri!r}: {exc}") from exc
    progress.finished()
