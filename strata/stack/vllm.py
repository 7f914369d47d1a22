"""A real vLLM engine beside a real KV-tier sidecar, as processes on loopback: what the vLLM
tests and benchmark run outside a cluster, with the command lines the operator renders.

The vLLM environment is the one the local pod runtime maps vLLM's images to (``make
vllm-env``); :func:`ensure_vllm_env` builds it where it is missing, with the installer's
progress on the console. A vLLM start imports torch in up to three processes: a minute or two
on a quiet two-core machine, several on a loaded one, so every wait here is bounded and fails
at once, with the process's last log lines, when the process exits.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from strata.cluster.podruntime.images import VLLM_ENV_VAR, VLLM_LOCAL_ENV, vllm_env_dir
from strata.common.endpoints import ENGINE_EVENTS_PATH
from strata.operator.api.engine import VLLM_CPU_BLOCK_MULTIPLE
from strata.operator.render.vllm import serve_args
from strata.stack.dataplane import stop, wait_ok
from strata.stack.local import local_resources
from strata.stack.manifests import inference_service
from strata.worker.block_events import parse_line
from strata.worker.config import WorkerConfig

REPO = Path(__file__).resolve().parents[2]
INSTALLER = REPO / "tools" / "vllm" / "install.sh"
CHART_TIERS = REPO / "charts" / "strata" / "files" / "servicetiers"
START_S = 1200.0  # vLLM's start on a loaded two-core machine (three processes import torch)
VLLM_CPU_BLOCK = VLLM_CPU_BLOCK_MULTIPLE  # the smallest block vLLM's CPU attention takes
# The arguments a CPU test engine takes: no graph capture, the model in the engine core's process.
LOCAL_ARGS = ["--enforce-eager", "--distributed-executor-backend=uni"]


def ensure_vllm_env() -> Path:
    """The vLLM environment's prefix, built first if it is not (prints the installer's steps)."""
    env = vllm_env_dir(REPO)
    if os.environ.get(VLLM_ENV_VAR) is None:  # ours: the installer is a no-op when it is current
        subprocess.run([str(INSTALLER), str(env.parent)], check=True, stdout=sys.stderr)
    return env


@dataclass
class Engine:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path


def vllm_command(env: Path, config: WorkerConfig, config_path: Path, port: int, *extra: str) -> list[str]:
    args = serve_args(config.model_copy(update={"server": config.server.model_copy(update={"port": port})}),
                      0, "127.0.0.1", str(config_path))  # fmt: skip
    return [str(env / "bin" / "vllm"), "serve", config.model.path, *args, *extra]


def vllm_process_env(env: Path) -> dict[str, str]:
    """This process's environment with the vLLM environment's, as the local pod runtime gives a
    vLLM container: its bin first, its local settings, this checkout importable, and vLLM's
    processes finding each other on loopback (unset, vLLM probes a public address for its own)."""
    path = f"{env / 'bin'}:{os.environ.get('PATH', '')}"
    return {
        **os.environ,
        **VLLM_LOCAL_ENV,
        "PATH": path,
        "PYTHONPATH": str(REPO),
        "VLLM_HOST_IP": "127.0.0.1",
    }


@contextmanager
def running_vllm(
    env: Path, config: WorkerConfig, config_path: Path, port: int, log: Path, *extra: str
) -> Iterator[Engine]:
    """vLLM serving ``config``'s model on 127.0.0.1:``port`` until the block ends."""
    proc = subprocess.Popen(
        vllm_command(env, config, config_path, port, *extra),
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        env=vllm_process_env(env),
        start_new_session=True,  # its engine-core and worker processes go with it
    )
    engine = Engine(f"http://127.0.0.1:{port}", proc, log)
    try:
        wait_ok(engine.url + "/health", proc, log, START_S)
        yield engine
    finally:
        kill_group(proc)


@contextmanager
def running_sidecar(config_path: Path, metrics_port: int, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``strata kvtier serve`` on ``config_path`` (its /metrics and block events on 127.0.0.1)."""
    argv = [sys.executable, "-m", "strata", "kvtier", "serve", "--config", str(config_path)]
    argv += ["--host", "127.0.0.1", "--metrics-port", str(metrics_port)]
    proc = subprocess.Popen(argv, stdout=log.open("ab"), stderr=subprocess.STDOUT)
    try:
        wait_ok(f"http://127.0.0.1:{metrics_port}/health", proc, log, START_S)
        yield proc
    finally:
        stop(proc)


def relayed_keys(kv_metrics: str) -> set[bytes]:
    """A vLLM engine's HBM block keys as its sidecar's relay reports them (the stream's snapshot),
    from the sidecar's metrics base URL."""
    keys: set[bytes] = set()
    with httpx.stream("GET", f"{kv_metrics}{ENGINE_EVENTS_PATH}", timeout=10) as stream:
        for line in stream.iter_lines():
            event = parse_line(line)
            if event.kind == "synced":
                break
            keys.update(event.blocks)
    return keys


def kill_group(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    """The engine and every process it started (vLLM's engine core and workers)."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
    stop(proc)


def vllm_tier(name: str) -> dict[str, Any]:
    """The chart's premium tier (write-through, NVMe surviving restarts) renamed, at priority 0
    so its pods wait for room on the local node rather than preempt, every block admitted on
    first sight (a single prompt shows each tier), no shared tier."""
    manifest: dict[str, Any] = yaml.safe_load((CHART_TIERS / "premium.yaml").read_text())
    manifest["metadata"] = {"name": name}
    manifest["spec"]["priority"] = 0
    for tier in ("dram", "nvme"):
        manifest["spec"]["cache"][tier]["admission"] = "always"
    manifest["spec"]["cache"]["nvme"]["admitAfterHits"] = 0
    manifest["spec"]["cache"]["shared"]["enabled"] = False
    return manifest


def vllm_service(
    name: str, tier: str, preset: str, cache: dict[str, Any], max_context: int = 4096, **spec: Any
) -> dict[str, Any]:
    """A vLLM service of a builtin test model on the local node's CPU: float32, blocks of 32
    (vLLM's CPU attention takes no fewer), eager (no graph capture on the CPU), the engine core
    running its model in-process (one process fewer to import torch)."""
    manifest = inference_service(name, tier, resources=local_resources("500m", "6Gi"), cache=cache, **spec)
    manifest["spec"]["model"] = {
        "name": preset, "source": {"builtin": preset}, "dtype": "float32", "maxContextTokens": max_context,
    }  # fmt: skip
    manifest["spec"]["engine"] = {"kind": "vllm", "blockSize": VLLM_CPU_BLOCK, "vllm": {"args": LOCAL_ARGS}}
    return manifest
