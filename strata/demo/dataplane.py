"""The data-plane half of the demo: serve the operator's rendered config for real.

Fake GPU nodes run no containers, so the demo runs the pod's two containers, the torch worker and
the KV-tier sidecar, as processes here, from the very worker.yaml the operator put in the
ConfigMap; only paths, ports and the device are localised. Then one long prompt shows each tier
of the hierarchy: cold, HBM hit, DRAM hit after a worker restart (HBM is gone; the premium tier
wrote the blocks through to DRAM), NVMe hit after both processes restart (DRAM is gone; the NVMe
index survives).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from strata.demo.detached import Detached
from strata.stack import free_port
from strata.worker.config import WorkerConfig
from strata.worker.fetch import fetch_model

# Laptop-sized copies of the tier capacities: the demo machine is not a GPU server.
MAX_DRAM_BYTES = 1 * 2**30
MAX_NVME_BYTES = 4 * 2**30
TIERS = ("hbm", "dram", "nvme", "shared")


@dataclass(frozen=True)
class Endpoints:
    api: str
    kv_metrics: str


def shm_dir(root: Path) -> Path:
    """The DRAM tier's shared-memory directory, one per demo directory (two demos never share)."""
    return Path("/dev/shm") / f"strata-demo-{hashlib.sha256(str(root).encode()).hexdigest()[:12]}"


def nvme_dir(root: Path) -> Path:
    """The NVMe tier's directory of a demo directory (its file is preallocated: gigabytes of disk)."""
    return root / "nvme"


def localize(rendered: str, root: Path, host: str, port: int) -> WorkerConfig:
    """The rendered config with this machine's paths, listening on ``host:port``, on the CPU."""
    data: dict[str, Any] = WorkerConfig.from_yaml(rendered).model_dump(mode="json")
    model_dir = root / "models" / data["model"]["name"]
    data["model"]["path"] = str(model_dir)
    data["engine"]["device"] = "cpu"
    data["server"] = {**data["server"], "host": host, "port": port}
    kv = data["kvtier"]
    kv["socket_path"] = str(root / "run" / "kvtier.sock")
    kv["metrics_port"] = free_port()
    kv["dram"]["shm_path"] = str(shm_dir(root) / "kv")
    kv["dram"]["capacity_bytes"] = min(kv["dram"]["capacity_bytes"], MAX_DRAM_BYTES)
    kv["nvme"]["path"] = str(nvme_dir(root))
    kv["nvme"]["capacity_bytes"] = min(kv["nvme"]["capacity_bytes"], MAX_NVME_BYTES)
    kv["shared"]["path"] = str(root / "shared")
    return WorkerConfig.model_validate(data)


def prepare(config: WorkerConfig, source: str, root: Path) -> Path:
    """Fetch the model as the pod's init container would, and write the localised config. Cache
    state from an earlier run is wiped, so that the first request really is cold."""
    fetch_model(source, config.model.path)
    for path in (
        Path(config.kvtier.socket_path).parent,
        Path(config.kvtier.nvme.path),
        Path(config.kvtier.shared.path),
        Path(config.kvtier.dram.shm_path).parent,
    ):
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
    config_path = root / "worker.yaml"
    config_path.write_text(config.to_yaml())
    return config_path


def start_sidecar(detached: Detached, config_path: Path) -> None:
    detached.start(
        "kvtier", [sys.executable, "-m", "strata", "kvtier", "serve", "--config", str(config_path)]
    )


def start_worker(detached: Detached, config_path: Path, config: WorkerConfig, timeout_s: float = 180) -> str:
    detached.start(
        "worker", [sys.executable, "-m", "strata", "worker", "serve", "--config", str(config_path)]
    )
    api = f"http://{config.server.host}:{config.server.port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{api}/ready", timeout=2).status_code == 200:
                return api
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    tail = detached.log("worker").read_text(errors="replace")[-2000:]
    raise RuntimeError(f"the worker did not become ready in {timeout_s:.0f}s; log tail:\n{tail}")


def long_prompt(tokens: int) -> str:
    """A deterministic document; the test models' byte-level tokenizer makes one char one token."""
    words = ["tier", "block", "prefix", "cache", "token", "memory", "latency", "batch", "node", "hit"]
    text: list[str] = []
    length = 0
    while length < tokens:
        word = f"{words[len(text) % len(words)]}{len(text) % 97}"
        text.append(word)
        length += len(word) + 1
    return " ".join(text)[:tokens]


def time_to_first_token(api: str, model: str, prompt: str) -> float:
    """Client-side TTFT: from sending the request to the first streamed token."""
    body = {"model": model, "prompt": prompt, "max_tokens": 4, "temperature": 0, "stream": True}
    start = time.perf_counter()
    with httpx.stream("POST", f"{api}/v1/completions", json=body, timeout=600) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line.removeprefix("data: "))
                if chunk["choices"][0].get("text") is not None:
                    return time.perf_counter() - start
    raise RuntimeError("the stream ended before the first token")


def hit_tokens(api: str) -> dict[str, float]:
    """Prompt tokens served from each cache tier so far (the worker's own counters)."""
    text = httpx.get(f"{api}/metrics", timeout=10).text
    hits = dict.fromkeys(TIERS, 0.0)
    for line in text.splitlines():
        if line.startswith("strata_worker_prefix_hit_tokens_total{"):
            tier = line.split('tier="', 1)[1].split('"', 1)[0]
            hits[tier] = float(line.rsplit(" ", 1)[1])
    return hits
