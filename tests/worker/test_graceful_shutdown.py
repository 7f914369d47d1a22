"""SIGTERM as a pod deletion delivers it, to real processes (`tiny` model, one thread): the
worker stops being ready at once, refuses new requests with 503, finishes every request it had
accepted (streams mid-flight and queued ones), logs what it did as JSON, and exits 0; the KV-tier
sidecar, signalled at the same moment, serves until the engine has let go of it."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.worker.worker_proc import free_port, running_worker

pytestmark = pytest.mark.slow
STREAMS, STREAM_TOKENS, PLAIN_TOKENS = 3, 240, 120
# Longer than a block (16 byte tokens): admission looks the prompt up in the KV tiers, so the
# engine holds a connection to the sidecar while it drains.
PROMPT = "a prompt of a few blocks, long enough to reach the KV-tier sidecar"
BOUND_S = 600.0  # generous: importing torch took over 120 s at load 20; every wait ends on an event


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="drain-", dir="/tmp"))  # Unix socket paths are short
    yield path
    shutil.rmtree(path, ignore_errors=True)


def write_config(root: Path, model: Path) -> tuple[Path, str]:
    """A worker with a DRAM tier behind a sidecar, both on loopback."""
    port = free_port()
    lines = [
        f"model: {{name: tiny, path: {model}, max_context_tokens: 512}}",
        "engine: {device: cpu, num_gpu_blocks: 128, cpu_threads: 1, max_num_seqs: 2}",
        f"server: {{host: 127.0.0.1, port: {port}, drain_timeout_s: {BOUND_S}}}",
        f"kvtier: {{enabled: true, socket_path: {root}/kv.sock, metrics_port: {free_port()},"
        f" dram: {{capacity_bytes: 4194304, shm_path: {root}/shm/kv}}}}",
    ]
    path = root / "worker.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path, f"http://127.0.0.1:{port}"


def spawn(root: Path, name: str, *args: str) -> subprocess.Popen[bytes]:
    log = (root / f"{name}.log").open("wb")
    return subprocess.Popen([sys.executable, "-m", "strata", *args], stdout=log, stderr=subprocess.STDOUT)


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]  # every line is JSON


def event(lines: list[dict[str, Any]], name: str) -> dict[str, Any]:
    found = [line for line in lines if line.get("event") == name]
    assert len(found) == 1, f"expected one {name!r} line in {lines}"
    return found[0]


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def wait_for(what: str, check: Any, procs: list[subprocess.Popen[bytes]]) -> Any:
    deadline = time.monotonic() + BOUND_S
    while time.monotonic() < deadline:
        for proc in procs:
            assert proc.poll() is None, (
                f"{proc.args!r} exited early with {proc.returncode} while waiting for {what}"
            )
        try:
            if result := check():
                return result
        except OSError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"timed out after {BOUND_S:.0f} s waiting for {what}")


def accepted(base: str) -> int:
    """Requests the worker holds: queued plus running, from its own metrics."""
    text = get(base + "/metrics")[1]
    values = {
        line.split()[0]: float(line.split()[1])
        for line in text.splitlines()
        if line.startswith(("strata_worker_queue_length ", "strata_worker_running_requests "))
    }
    return round(sum(values.values()))


async def stream(client: openai.AsyncOpenAI, started: asyncio.Event) -> str | None:
    chunks = await client.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=STREAM_TOKENS, stream=True, extra_body={"ignore_eos": True}
    )
    reason = None
    async for chunk in chunks:
        started.set()
        reason = chunk.choices[0].finish_reason or reason
    return reason


async def plain(client: openai.AsyncOpenAI) -> int:
    done = await client.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=PLAIN_TOKENS, extra_body={"ignore_eos": True}
    )
    assert done.usage is not None
    return done.usage.completion_tokens


async def load_then_sigterm(base: str, procs: list[subprocess.Popen[bytes]]) -> None:
    # max_retries=0: a retried request would hide the very error this test looks for.
    client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=BOUND_S)
    started = asyncio.Event()
    streams = [asyncio.ensure_future(stream(client, started)) for _ in range(STREAMS)]
    answer = asyncio.ensure_future(plain(client))
    await asyncio.wait_for(started.wait(), BOUND_S)
    await asyncio.to_thread(wait_for, "every request accepted", lambda: accepted(base) == STREAMS + 1, procs)
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    await asyncio.to_thread(wait_for, "readiness to fail", lambda: get(base + "/ready")[0] == 503, procs[:1])
    with pytest.raises(openai.InternalServerError) as refused:
        await client.completions.create(model="tiny", prompt="late", max_tokens=2)
    assert refused.value.status_code == 503 and "draining" in refused.value.message
    assert await asyncio.gather(*streams) == ["length"] * STREAMS  # no stream cut, no error
    assert await answer == PLAIN_TOKENS
    await client.close()


def test_sigterm_mid_stream_finishes_everything_and_exits_cleanly(root: Path, tiny_dir: Path) -> None:
    config, base = write_config(root, tiny_dir)
    sidecar = spawn(root, "kvtier", "kvtier", "serve", "--config", str(config))
    worker = spawn(root, "worker", "worker", "serve", "--config", str(config))
    try:
        wait_for("the worker to be ready", lambda: get(base + "/ready")[0] == 200, [sidecar, worker])
        asyncio.run(load_then_sigterm(base, [worker, sidecar]))
        assert worker.wait(BOUND_S) == 0 and sidecar.wait(BOUND_S) == 0
    finally:
        for proc in (worker, sidecar):
            proc.kill()
            proc.wait()
    lines = json_lines((root / "worker.log").read_text())
    shutdown, drained = event(lines, "shutdown"), event(lines, "drained")
    assert (shutdown["signal"], shutdown["in_flight"], shutdown["streams"]) == (
        "SIGTERM",
        STREAMS + 1,
        STREAMS,
    )
    assert (drained["finished"], drained["streams"], drained["errors"], drained["aborted"]) == (
        STREAMS + 1,
        STREAMS,
        0,
        0,
    )
    event(lines, "stopped")
    side = json_lines((root / "kvtier.log").read_text())
    assert event(side, "shutdown")["connections"] >= 1  # the engine was still connected
    assert event(side, "stopped")["engine_disconnected"] is True


async def load_then_two_signals(base: str, worker: subprocess.Popen[bytes]) -> list[int | str | None]:
    client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=BOUND_S)

    async def one() -> int | str | None:
        try:
            done = await client.completions.create(
                model="tiny", prompt="x", max_tokens=500, extra_body={"ignore_eos": True}
            )
        except openai.APIStatusError as err:
            return err.status_code
        return done.choices[0].finish_reason

    pending = [asyncio.ensure_future(one()) for _ in range(3)]
    await asyncio.to_thread(wait_for, "every request accepted", lambda: accepted(base) == 3, [worker])
    worker.send_signal(signal.SIGTERM)
    await asyncio.to_thread(wait_for, "readiness to fail", lambda: get(base + "/ready")[0] == 503, [worker])
    worker.send_signal(signal.SIGINT)
    outcomes = await asyncio.gather(*pending)
    await client.close()
    return outcomes


def test_a_second_signal_cuts_the_drain_short(tmp_path: Path, tiny_dir: Path) -> None:
    with running_worker(tiny_dir, tmp_path, max_num_seqs=2) as worker:
        outcomes = asyncio.run(load_then_two_signals(worker.base_url, worker.proc))
        assert worker.proc.wait(BOUND_S) == 0
        drained = event(json_lines(worker.log_path.read_text()), "drained")
    assert drained["aborted"] >= 1 and drained["finished"] == 3
    # Each ends at once and says so: a response cut mid-generation (finish_reason "error"), or a
    # 503 for one that had not produced a token yet (the queued one at least).
    assert set(map(str, outcomes)) <= {"503", "error"} and "503" in map(str, outcomes)
