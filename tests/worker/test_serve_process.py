"""``strata worker serve`` as the operator runs it: a real process on a loopback port that
becomes ready, answers, and exits cleanly on SIGTERM."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_serve_becomes_ready_answers_and_stops(tmp_path: Path, tiny_dir: Path) -> None:
    port = free_port()
    config = tmp_path / "worker.yaml"
    config.write_text(
        f"model: {{name: tiny, path: {tiny_dir}, max_context_tokens: 512}}\n"
        "engine: {device: auto, num_gpu_blocks: 64}\n"
        f"server: {{host: 127.0.0.1, port: {port}}}\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "strata", "worker", "serve", "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 300  # generous: importing torch on a loaded machine is slow
        while True:
            try:
                with urllib.request.urlopen(base + "/ready", timeout=2) as resp:
                    assert resp.status == 200
                    break
            except OSError:
                assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
                assert time.monotonic() < deadline, "worker never became ready"
                time.sleep(0.2)
        body = json.dumps({"model": "tiny", "prompt": "hi", "max_tokens": 3, "ignore_eos": True}).encode()
        request = urllib.request.Request(base + "/v1/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as resp:
            assert json.loads(resp.read())["usage"]["completion_tokens"] == 3
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out.decode()
    assert b"engine ready" in out
