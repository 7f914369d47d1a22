"""`strata worker fetch-model`: every source kind against a real HTTP server on loopback."""

from __future__ import annotations

import functools
import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from strata.worker.fetch import MARKER, FetchError, fetch_model, resolve_http
from strata.worker.models.loader import read_config
from strata.worker.models.presets import write_model


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A directory tree served over HTTP: /tiny (one weights file), /sharded (an index + 2 shards)."""
    root = tmp_path_factory.mktemp("http")
    tiny = write_model(root / "bucket" / "tiny", "tiny")
    sharded = root / "bucket" / "sharded"
    sharded.mkdir()
    (sharded / "config.json").write_text((tiny / "config.json").read_text())
    weights = (tiny / "model.safetensors").read_bytes()
    (sharded / "a.safetensors").write_bytes(weights)
    (sharded / "b.safetensors").write_bytes(weights)
    index = {"weight_map": {"x": "a.safetensors", "y": "b.safetensors", "z": "a.safetensors"}}
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index))
    handler = functools.partial(QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}", root
    server.shutdown()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def test_builtin_writes_a_loadable_model(tmp_path: Path) -> None:
    out = fetch_model("builtin://tiny", tmp_path / "m")
    assert read_config(out).num_hidden_layers == 2
    assert (out / MARKER).read_text() == "builtin://tiny"


def test_unknown_builtin_names_the_choices(tmp_path: Path) -> None:
    with pytest.raises(FetchError, match=r"builtin://huge: unknown built-in model.*tiny"):
        fetch_model("builtin://huge", tmp_path)


def test_http_single_file_is_bit_exact(served: tuple[str, Path], tmp_path: Path) -> None:
    url, root = served
    out = fetch_model(f"{url}/bucket/tiny", tmp_path / "m")
    src = root / "bucket" / "tiny" / "model.safetensors"
    assert (out / "model.safetensors").read_bytes() == src.read_bytes()
    assert not list(out.glob("*.part"))


def test_http_sharded_fetches_every_shard_once(served: tuple[str, Path], tmp_path: Path) -> None:
    url, _ = served
    out = fetch_model(f"{url}/bucket/sharded/", tmp_path / "m")
    assert sorted(p.name for p in out.glob("*.safetensors")) == ["a.safetensors", "b.safetensors"]
    assert not (out / "model.safetensors").exists()


def test_s3_with_endpoint_is_path_style(served: tuple[str, Path], tmp_path: Path, monkeypatch) -> None:
    url, _ = served
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", url)
    out = fetch_model("s3://bucket/tiny", tmp_path / "m")
    assert read_config(out).hidden_size == 64


def test_missing_config_is_a_clear_error(served: tuple[str, Path], tmp_path: Path) -> None:
    url, _ = served
    with pytest.raises(FetchError, match=r"GET config.json answered HTTP 404"):
        fetch_model(f"{url}/bucket/nothing", tmp_path / "m")
    assert not (tmp_path / "m" / MARKER).exists()


def test_second_fetch_of_same_source_is_skipped(served: tuple[str, Path], tmp_path: Path) -> None:
    url, _ = served
    out = fetch_model(f"{url}/bucket/tiny", tmp_path / "m")
    (out / "model.safetensors").write_bytes(b"kept")  # proves no second download happened
    fetch_model(f"{url}/bucket/tiny", out)
    assert (out / "model.safetensors").read_bytes() == b"kept"


def test_unreachable_server_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FetchError, match=r"GET config.json failed"):
        fetch_model("http://127.0.0.1:9/none", tmp_path)


@pytest.mark.parametrize(
    ("uri", "env", "base"),
    [
        ("hf://meta/llama", {}, "https://huggingface.co/meta/llama/resolve/main/"),
        ("hf://meta/llama@v2", {"HF_ENDPOINT": "http://mirror"}, "http://mirror/meta/llama/resolve/v2/"),
        ("s3://b/models/x/", {}, "https://b.s3.amazonaws.com/models/x/"),
        ("gs://b/x", {}, "https://storage.googleapis.com/b/x/"),
        ("https://host/m", {}, "https://host/m/"),
    ],
)
def test_resolve_http(uri: str, env: dict[str, str], base: str) -> None:
    assert resolve_http(uri, env).base_url == base


def test_hf_token_becomes_bearer() -> None:
    assert resolve_http("hf://a/b", {"HF_TOKEN": "t"}).headers == (("Authorization", "Bearer t"),)


def test_unsupported_scheme() -> None:
    with pytest.raises(FetchError, match="unsupported scheme 'ftp'"):
        resolve_http("ftp://x/y", {})
