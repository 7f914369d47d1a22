"""`strata worker fetch-model`: every source kind against a real HTTP server on loopback, and a
fetch killed half-way that resumes with only what is missing."""

from __future__ import annotations

import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from strata.worker.fetch import MARKER, FetchOptions, fetch_model
from strata.worker.fetch_hf import parse_hf, selected, weight_patterns
from strata.worker.fetch_http import FetchError, resolve_http
from strata.worker.models.presets import write_model
from strata.worker.models.registry import read_config

SHARD_BYTES = 2 * 2**20
STALL_AT = 2**20  # the server stops sending shard b here until released


@dataclass
class ServerState:
    root: Path
    requests: list[tuple[str, int, int]] = field(default_factory=list)  # name, range start, bytes sent
    stall: dict[str, int] = field(default_factory=dict)
    release: threading.Event = field(default_factory=threading.Event)
    honour_ranges: bool = True


class RangeHandler(http.server.BaseHTTPRequestHandler):
    """Files under the root, with Range support (SimpleHTTPRequestHandler has none)."""

    state: ServerState

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        path = self.state.root / self.path.lstrip("/")
        if not path.is_file():
            self.send_error(404)
            return
        data, start = path.read_bytes(), 0
        ranged = self.headers.get("Range", "").removeprefix("bytes=").removesuffix("-")
        if ranged and self.state.honour_ranges:
            start = int(ranged)
            if start >= len(data):
                self.send_error(416)
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(len(data) - start))
        self.end_headers()
        self._send(path.name, data, start)

    def _send(self, name: str, data: bytes, start: int) -> None:
        sent, stall = 0, self.state.stall.get(name)
        try:
            for pos in range(start, len(data), 64 * 1024):
                if stall is not None and pos >= stall:
                    self.state.release.wait(timeout=300)
                    stall = None
                self.wfile.write(data[pos : pos + 64 * 1024])
                sent += len(data[pos : pos + 64 * 1024])
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            self.state.requests.append((name, start, sent))


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, ServerState]]:
    """/bucket/tiny (one weights file) and /bucket/sharded (an index and three 2 MiB shards)."""
    root = tmp_path_factory.mktemp("http")
    tiny = write_model(root / "bucket" / "tiny", "tiny")
    sharded = root / "bucket" / "sharded"
    sharded.mkdir()
    (sharded / "config.json").write_text((tiny / "config.json").read_text())
    for i, name in enumerate(("a", "b", "c")):
        (sharded / f"{name}.safetensors").write_bytes(bytes([i]) * SHARD_BYTES)
    index = {
        "weight_map": {"x": "a.safetensors", "y": "b.safetensors", "z": "c.safetensors", "w": "a.safetensors"}
    }
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index))
    state = ServerState(root)
    handler = type("Handler", (RangeHandler,), {"state": state})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}", state
    state.release.set()
    server.shutdown()


def test_builtin_writes_a_loadable_model(tmp_path: Path) -> None:
    out = fetch_model("builtin://tiny", tmp_path / "m")
    assert read_config(out).num_hidden_layers == 2
    assert (out / MARKER).read_text() == "builtin://tiny"


def test_unknown_builtin_names_the_choices(tmp_path: Path) -> None:
    with pytest.raises(FetchError, match=r"builtin://huge: unknown built-in model.*tiny"):
        fetch_model("builtin://huge", tmp_path)


def test_http_single_file_is_bit_exact(served: tuple[str, ServerState], tmp_path: Path) -> None:
    url, state = served
    out = fetch_model(f"{url}/bucket/tiny", tmp_path / "m")
    src = state.root / "bucket" / "tiny" / "model.safetensors"
    assert (out / "model.safetensors").read_bytes() == src.read_bytes()
    assert not list(out.glob("*.part"))


def test_http_sharded_fetches_every_shard_once(served: tuple[str, ServerState], tmp_path: Path) -> None:
    url, state = served
    state.requests.clear()
    out = fetch_model(f"{url}/bucket/sharded/", tmp_path / "m", FetchOptions(workers=3))
    names = sorted(p.name for p in out.glob("*.safetensors"))
    assert names == ["a.safetensors", "b.safetensors", "c.safetensors"]
    assert sorted(n for n, _, _ in state.requests if n.endswith(".safetensors")) == names


def test_include_and_exclude(served: tuple[str, ServerState], tmp_path: Path) -> None:
    url, state = served
    (state.root / "bucket" / "tiny" / "extra.txt").write_text("x")
    out = fetch_model(f"{url}/bucket/tiny", tmp_path / "m", FetchOptions(include=("extra.txt",)))
    assert (out / "extra.txt").read_text() == "x"
    with pytest.raises(FetchError, match=r"GET missing.txt answered HTTP 404"):  # an include is required
        fetch_model(f"{url}/bucket/tiny", tmp_path / "n", FetchOptions(include=("missing.txt",)))
    state.requests.clear()
    out = fetch_model(f"{url}/bucket/sharded", tmp_path / "o", FetchOptions(exclude=("tokenizer*", "c.*")))
    assert not (out / "c.safetensors").exists()
    assert not any(n.startswith(("tokenizer", "c.")) for n, _, _ in state.requests)


def test_s3_with_endpoint_is_path_style(
    served: tuple[str, ServerState], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _ = served
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", url)
    out = fetch_model("s3://bucket/tiny", tmp_path / "m")
    assert read_config(out).hidden_size == 64


def test_missing_config_is_a_clear_error(served: tuple[str, ServerState], tmp_path: Path) -> None:
    url, _ = served
    with pytest.raises(FetchError, match=r"GET config.json answered HTTP 404"):
        fetch_model(f"{url}/bucket/nothing", tmp_path / "m")
    assert not (tmp_path / "m" / MARKER).exists()


def test_second_fetch_of_same_source_is_skipped(served: tuple[str, ServerState], tmp_path: Path) -> None:
    url, _ = served
    out = fetch_model(f"{url}/bucket/tiny", tmp_path / "m")
    (out / "model.safetensors").write_bytes(b"kept")  # proves no second download happened
    fetch_model(f"{url}/bucket/tiny", out)
    assert (out / "model.safetensors").read_bytes() == b"kept"


def test_another_source_clears_the_old_files(served: tuple[str, ServerState], tmp_path: Path) -> None:
    url, state = served
    out = fetch_model(f"{url}/bucket/tiny", tmp_path / "m")
    fetch_model(f"{url}/bucket/sharded", out)
    assert not (out / "model.safetensors").exists()
    assert (out / "config.json").read_text() == (
        state.root / "bucket" / "sharded" / "config.json"
    ).read_text()


def test_unreachable_server_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FetchError, match=r"GET config.json failed"):
        fetch_model("http://127.0.0.1:9/none", tmp_path)


def wait_for(condition: object, what: str, timeout_s: float = 600) -> None:  # a loaded machine
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.mark.slow
def test_fetch_killed_half_way_resumes_with_only_what_is_missing(
    served: tuple[str, ServerState], tmp_path: Path
) -> None:
    url, state = served
    src, out = state.root / "bucket" / "sharded", tmp_path / "m"
    state.stall, state.release = {"b.safetensors": STALL_AT}, threading.Event()
    first = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "strata",
            "worker",
            "fetch-model",
            "--source",
            f"{url}/bucket/sharded",
            "--dest",
            str(out),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    part = out / "b.safetensors.part"
    try:
        whole = ("config.json", SHARD_INDEX_NAME, "a.safetensors", "c.safetensors")
        wait_for(lambda: all((out / n).is_file() for n in whole), "the other files")
        wait_for(lambda: part.is_file() and part.stat().st_size >= STALL_AT, "half of shard b")
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=60)
    kept = part.stat().st_size
    state.requests.clear()
    state.stall = {}
    state.release.set()
    fetch_model(f"{url}/bucket/sharded", out)
    shards = {n: (start, sent) for n, start, sent in state.requests if n.endswith(".safetensors")}
    assert shards == {"b.safetensors": (kept, SHARD_BYTES - kept)}  # only b's missing bytes
    assert not any(n in whole for n, _, _ in state.requests)  # whole files were not asked for again
    for name in ("a", "b", "c"):
        assert (out / f"{name}.safetensors").read_bytes() == (src / f"{name}.safetensors").read_bytes()
    assert not part.exists()


SHARD_INDEX_NAME = "model.safetensors.index.json"


def test_a_server_ignoring_ranges_restarts_the_file(served: tuple[str, ServerState], tmp_path: Path) -> None:
    url, state = served
    out = tmp_path / "m"
    out.mkdir()
    (out / "b.safetensors.part").write_bytes(b"\x09" * 1000)  # garbage from an earlier run
    state.honour_ranges = False
    try:
        fetch_model(f"{url}/bucket/sharded", out)
    finally:
        state.honour_ranges = True
    assert (out / "b.safetensors").read_bytes() == (
        state.root / "bucket" / "sharded" / "b.safetensors"
    ).read_bytes()


@pytest.mark.parametrize(
    ("uri", "env", "base"),
    [
        ("s3://b/models/x/", {}, "https://b.s3.amazonaws.com/models/x/"),
        ("gs://b/x", {}, "https://storage.googleapis.com/b/x/"),
        ("https://host/m", {}, "https://host/m/"),
    ],
)
def test_resolve_http(uri: str, env: dict[str, str], base: str) -> None:
    assert resolve_http(uri, env).base_url == base


def test_unsupported_scheme() -> None:
    with pytest.raises(FetchError, match="unsupported scheme 'ftp'"):
        resolve_http("ftp://x/y", {})


def test_hf_source_and_file_selection(tmp_path: Path) -> None:
    assert parse_hf("hf://meta/llama") == ("meta/llama", None)
    assert parse_hf("hf://meta/llama@v2") == ("meta/llama", "v2")
    with pytest.raises(FetchError, match="expected hf://<org>/<name>"):
        parse_hf("hf://llama")
    assert weight_patterns(tmp_path) == ["model.safetensors"]
    index = {"weight_map": {"a": "m-1.safetensors", "b": "m-2.safetensors", "c": "m-1.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    assert weight_patterns(tmp_path) == ["m-1.safetensors", "m-2.safetensors"]  # never consolidated.*
    assert selected(["config.json", "tokenizer.json"], ("*.model",), ("tokenizer*",)) == [
        "config.json",
        "*.model",
    ]
