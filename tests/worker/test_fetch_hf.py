"""``hf://`` through huggingface_hub against a hub on loopback (HF_ENDPOINT): only the needed
files come down, and a second run fetches only what is missing."""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from strata.worker.fetch import MARKER, FetchOptions, fetch_model
from strata.worker.fetch_http import FetchError
from strata.worker.models.presets import write_model

SHA = "0123456789abcdef0123456789abcdef01234567"
REPO = "acme/tiny-chat"


class HubHandler(http.server.BaseHTTPRequestHandler):
    """The two hub endpoints snapshot_download uses: repo info, and resolve (HEAD and GET)."""

    files: dict[str, bytes]
    gets: list[str]

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _file(self) -> tuple[str, bytes] | None:
        prefix = f"/{REPO}/resolve/"
        if not self.path.startswith(prefix):
            return None
        name = self.path[len(prefix) :].split("/", 1)[1]
        return (name, self.files[name]) if name in self.files else None

    def _headers(self, data: bytes) -> None:
        self.send_header("X-Repo-Commit", SHA)
        self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()

    @staticmethod
    def _entry(name: str, data: bytes) -> dict[str, object]:
        oid = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        return {"type": "file", "path": name, "size": len(data), "oid": oid}

    def do_HEAD(self) -> None:
        found = self._file()
        if found is None:
            self.send_error(404)
            return
        self.send_response(200)
        self._headers(found[1])

    def do_GET(self) -> None:
        if self.path.startswith(f"/api/models/{REPO}/tree/"):  # the file listing
            body = json.dumps([self._entry(name, data) for name, data in self.files.items()]).encode()
        elif self.path.startswith(f"/api/models/{REPO}"):  # the repository: its commit
            body = json.dumps(
                {"id": REPO, "sha": SHA, "siblings": [{"rfilename": f} for f in self.files]}
            ).encode()
        else:
            body = b""
        if body:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        found = self._file()
        if found is None:
            self.send_error(404)
            return
        self.gets.append(found[0])
        self.send_response(200)
        self._headers(found[1])
        self.wfile.write(found[1])


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, HubHandler]]:
    model = write_model(tmp_path_factory.mktemp("hub"), "tiny")
    weights = (model / "model.safetensors").read_bytes()
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    files = {
        "config.json": (model / "config.json").read_bytes(),
        "generation_config.json": b'{"eos_token_id": [257]}',
        "model.safetensors.index.json": json.dumps(index).encode(),
        "model-00001-of-00002.safetensors": weights,
        "model-00002-of-00002.safetensors": weights[::-1],
        "consolidated.safetensors": weights,  # another format's copy: never fetched
        "pytorch_model.bin": b"x" * 1000,
        "README.md": b"# tiny",
    }
    handler = type("Hub", (HubHandler,), {"files": files, "gets": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}", handler  # type: ignore[misc]
    server.shutdown()


def test_hf_fetches_only_the_needed_files_and_resumes(
    hub: tuple[str, type[HubHandler]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint, handler = hub
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    out = fetch_model(f"hf://{REPO}", tmp_path / "m", FetchOptions(workers=2))
    wanted = {
        "config.json",
        "generation_config.json",
        "model.safetensors.index.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    }
    assert set(handler.gets) == wanted  # no consolidated copy, no .bin, no README
    assert {p.name for p in out.iterdir() if p.is_file() and not p.name.startswith(".")} == wanted
    for name in wanted:
        assert (out / name).read_bytes() == handler.files[name]
    handler.gets.clear()
    (out / MARKER).unlink()  # as after a crash before the end
    (out / "model-00002-of-00002.safetensors").unlink()
    fetch_model(f"hf://{REPO}", out)
    assert handler.gets == ["model-00002-of-00002.safetensors"]


def test_hf_unknown_repository_is_a_clear_error(
    hub: tuple[str, type[HubHandler]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", hub[0])
    with pytest.raises(FetchError, match=r"hf://acme/missing"):
        fetch_model("hf://acme/missing", tmp_path / "m")
