"""KV-tier benchmark: tier bandwidth next to plain memcpy and file I/O, TTFT from each tier next
to recomputation, and block-level prefix hit ratios of the eviction policies on the Mooncake
traces next to LRU and the offline optimum, all from one run on this machine.

The sidecar runs as a real process (``strata kvtier serve``); the benchmark is its client, so
bandwidths include the protocol round trips and the copies into and out of shared memory.
NVMe reads are measured after the data file's pages were dropped from the page cache
(``posix_fadvise(DONTNEED)``), like the plain file reads they are compared with.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from strata.worker.config import EngineConfig, KVTierConfig, ModelConfig, WorkerConfig
from strata.worker.kv_connector import BlockRef, KVConnector, Tier
from strata.worker.kvtier import simulate
from strata.worker.kvtier.client import TierClient

MiB = 2**20
BLOCK_SHAPE = (32, 2, 16, 8, 128)  # a 16-token block of a Llama-3-8B-like model: 2 MiB in bf16
DTYPE = torch.bfloat16
NUM_BLOCKS = 96  # 192 MiB per pass
REPEATS = 3
COPY_THREADS = 4  # as TierClient
CAPACITIES = (1000, 5000, 10000, 30000)
POLICIES = ("lru", "prefix-aware", "optimal")
PROMPTS = {"4k": 4096, "16k": 16384}
REPO = Path(__file__).resolve().parents[1]


def traces_dir() -> Path:
    return Path(os.environ.get("STRATA_TRACES_DIR", REPO / ".." / "shared" / "data" / "traces"))


# ---- plumbing ----


def _config(root: Path, name: str, dram: int, nvme: int, block_size: int = 16) -> WorkerConfig:
    kvtier = KVTierConfig(
        enabled=True,
        socket_path=str(root / f"{name}.sock"),
        dram={"capacity_bytes": dram, "shm_path": f"/dev/shm/strata-bench-{os.getpid()}-{name}"},
        nvme={"capacity_bytes": nvme, "path": str(root / f"{name}-nvme"), "admit_after_hits": 0},
    )
    return WorkerConfig(
        model=ModelConfig(name="small", path=str(root / "model"), max_context_tokens=32768),
        engine=EngineConfig(device="cpu", block_size=block_size, max_batched_tokens=2048),
        kvtier=kvtier,
    )


@contextmanager
def sidecar(root: Path, config: WorkerConfig) -> Iterator[KVTierConfig]:
    path = root / f"{Path(config.kvtier.socket_path).stem}.yaml"
    path.write_text(config.to_yaml())
    sock = Path(config.kvtier.socket_path)
    args = ["serve", "--config", str(path), "--metrics-port", "0", "--log-level", "WARNING"]
    proc = subprocess.Popen([sys.executable, "-m", "strata", "kvtier", *args])
    try:
        deadline = time.monotonic() + 60
        while not sock.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("kvtier sidecar did not start")
            time.sleep(0.05)
        yield config.kvtier
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        Path(config.kvtier.dram.shm_path).unlink(missing_ok=True)


def drop_page_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def best_gbps(nbytes: int, fn: Callable[[int], object], repeats: int = REPEATS) -> float:
    """Best of ``repeats`` runs of ``fn(repeat)``, in GB/s (best: the machine is shared)."""
    best = float("inf")
    for repeat in range(repeats):
        started = time.perf_counter()
        fn(repeat)
        best = min(best, time.perf_counter() - started)
    return round(nbytes / best / 1e9, 3)


def refs(prefix: int, count: int) -> list[BlockRef]:
    keys = [(prefix << 64 | i).to_bytes(16, "big") for i in range(count)]
    return [BlockRef(k, keys[i - 1] if i else b"\0" * 16, i) for i, k in enumerate(keys)]


# ---- bandwidth ----


def bandwidth(root: Path) -> dict[str, float]:
    blocks = [torch.randn(BLOCK_SHAPE).to(DTYPE) for _ in range(NUM_BLOCKS)]
    out = [torch.empty(BLOCK_SHAPE, dtype=DTYPE) for _ in range(NUM_BLOCKS)]
    nbytes = NUM_BLOCKS * blocks[0].numel() * blocks[0].element_size()
    pairs = list(zip(out, blocks, strict=True))
    with ThreadPoolExecutor(COPY_THREADS) as pool:  # the client copies on as many threads
        parallel = best_gbps(nbytes, lambda _: list(pool.map(lambda p: p[0].copy_(p[1]), pairs)), 5)
    result = {
        "memcpy_gbps": parallel,
        "memcpy_1thread_gbps": best_gbps(nbytes, lambda _: [o.copy_(b) for o, b in pairs], 5),
    }
    result |= file_io(root, blocks, nbytes)
    block_bytes = nbytes // NUM_BLOCKS
    dram_config = _config(root, "dram", dram=(NUM_BLOCKS + 8) * block_bytes, nvme=0)
    with sidecar(root, dram_config) as kv:
        client = TierClient(kv.socket_path, BLOCK_SHAPE, DTYPE)
        chains = [refs(r, NUM_BLOCKS) for r in range(REPEATS)]
        result["dram_put_gbps"] = best_gbps(nbytes, lambda r: client.save_checked(chains[r], blocks))
        last = [b.hash for b in chains[-1]]
        result["dram_get_gbps"] = best_gbps(nbytes, lambda _: _must_load(client, last, out))
        client.close()
    nvme_config = _config(root, "nvme", dram=0, nvme=(REPEATS * NUM_BLOCKS + 8) * block_bytes)
    with sidecar(root, nvme_config) as kv:
        client = TierClient(kv.socket_path, BLOCK_SHAPE, DTYPE)
        chains = [refs(10 + r, NUM_BLOCKS) for r in range(REPEATS)]
        result["nvme_write_gbps"] = best_gbps(nbytes, lambda r: client.save_checked(chains[r], blocks))
        data_file = Path(kv.nvme.path) / "blocks.dat"

        def read(repeat: int) -> None:
            drop_page_cache(data_file)
            _must_load(client, [b.hash for b in chains[repeat]], out)

        result["nvme_read_gbps"] = best_gbps(nbytes, read)
        client.close()
    assert all(
        torch.equal(o.view(torch.int16), b.view(torch.int16)) for o, b in zip(out, blocks, strict=True)
    )
    return result


def _must_load(client: TierClient, hashes: list[bytes], out: list[torch.Tensor]) -> None:
    if client.load(hashes, out) != len(hashes):
        raise RuntimeError("kvtier bench: the sidecar lost blocks")


def file_io(root: Path, blocks: list[torch.Tensor], nbytes: int) -> dict[str, float]:
    """Plain large-block file I/O on the same disk: one pwrite per block into a freshly
    preallocated file (as the NVMe tier writes into its preallocated slots), fsync at the end;
    reads after the pages were dropped from the cache."""
    views = [b.view(torch.uint8).reshape(-1).numpy().data for b in blocks]
    size = views[0].nbytes
    paths = [root / f"plain-{r}.dat" for r in range(REPEATS)]
    for path in paths:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        os.posix_fallocate(fd, 0, size * len(views))
        os.close(fd)

    def write(repeat: int) -> None:
        fd = os.open(paths[repeat], os.O_WRONLY)
        for i, view in enumerate(views):
            os.pwrite(fd, view, i * size)
        os.fsync(fd)
        os.close(fd)

    def read(repeat: int) -> None:
        drop_page_cache(paths[repeat])
        fd = os.open(paths[repeat], os.O_RDONLY)
        buf = bytearray(size)
        for i in range(len(views)):
            os.preadv(fd, [buf], i * size)
        os.close(fd)

    return {"file_write_gbps": best_gbps(nbytes, write), "file_read_gbps": best_gbps(nbytes, read)}


# ---- TTFT ----


class Switch:
    """A connector that forwards to whichever sidecar the benchmark points it at."""

    def __init__(self) -> None:
        self.target: KVConnector | None = None

    def lookup(self, hashes: Sequence[bytes]) -> list[Tier]:
        return self.target.lookup(hashes) if self.target else []

    def load(self, hashes: Sequence[bytes], out: Sequence[torch.Tensor]) -> int:
        return self.target.load(hashes, out) if self.target else 0

    def save(self, blocks: Sequence[BlockRef], data: Sequence[torch.Tensor]) -> None:
        if self.target:
            self.target.save(blocks, data)

    def prefetch(self, hashes: Sequence[bytes]) -> None:
        if self.target:
            self.target.prefetch(hashes)

    def close(self) -> None:
        pass


def ttft(root: Path) -> dict[str, dict[str, float]]:
    from strata.worker.engine.llm_engine import LLMEngine
    from strata.worker.engine.model_runner import block_shape
    from strata.worker.models.loader import DTYPES, load_model
    from strata.worker.models.presets import write_model
    from strata.worker.tokenizer import load_tokenizer

    write_model(root / "model", "small")
    base = _config(root, "probe", 0, 0)
    model = load_model(base.model.path, DTYPES[base.model.dtype], torch.device("cpu"))
    shape = block_shape(model, base.engine.block_size)
    block_bytes = int(torch.empty(shape).numel() * 4)
    blocks_16k = max(PROMPTS.values()) // base.engine.block_size + 8
    dram = _config(root, "ttft-dram", dram=blocks_16k * block_bytes, nvme=0)
    nvme = _config(root, "ttft-nvme", dram=0, nvme=blocks_16k * block_bytes)
    switch = Switch()
    engine = LLMEngine(dram, model, load_tokenizer(base.model.path), switch)
    result: dict[str, dict[str, float]] = {}
    with sidecar(root, dram) as dram_kv, sidecar(root, nvme) as nvme_kv:
        to_dram = TierClient(dram_kv.socket_path, shape, torch.float32)
        to_nvme = TierClient(nvme_kv.socket_path, shape, torch.float32)
        nvme_file = Path(nvme_kv.nvme.path) / "blocks.dat"
        for name, length in PROMPTS.items():
            tokens = [random.Random(length).randrange(3, 250) for _ in range(length)]
            result[name] = ttft_by_tier(engine, tokens, switch, to_dram, to_nvme, nvme_file)
        to_dram.close()
        to_nvme.close()
    return result


def ttft_by_tier(
    engine: Any,
    tokens: list[int],
    switch: Switch,
    to_dram: KVConnector,
    to_nvme: KVConnector,
    nvme_file: Path,
) -> dict[str, float]:
    """Time to first token of one prompt: computed cold, then served from HBM, DRAM and NVMe
    (each time pushed out of HBM first, into the sidecar under test)."""
    from strata.worker.engine.sequence import SamplingParams

    params = SamplingParams(max_tokens=1, ignore_eos=True)
    times: dict[str, float] = {}
    steps: list[tuple[str, KVConnector | None, bool]] = [
        ("cold", None, True),
        ("hbm", None, False),
        ("dram", to_dram, True),
        ("nvme", to_nvme, True),
    ]
    engine.generate(tokens[:64], params)  # warm-up: first-call costs are not a tier's
    for tier, target, evict in steps:
        best = float("inf")
        for _ in range(1 if tier == "cold" else 2):  # hits are cheap: best of two
            if evict:
                switch.target = target
                engine.evict_cached_blocks()
            if tier == "nvme":
                drop_page_cache(nvme_file)
            started = time.perf_counter()
            seq = engine.generate(tokens, params)
            best = min(best, time.perf_counter() - started)
            if tier != "cold" and seq.hit_tokens.get(tier, 0) < len(tokens) - 2 * engine.block_size:
                raise RuntimeError(f"kvtier bench: expected a {tier} hit, got {seq.hit_tokens}")
        times[tier] = round(best, 4)
    return times


# ---- hit ratio ----


def hit_ratios() -> dict[str, dict[str, dict[str, float]]]:
    result: dict[str, dict[str, dict[str, float]]] = {}
    for path in sorted(traces_dir().glob("*.jsonl")):
        trace = simulate.load_trace(path)
        result[path.name] = {
            policy: {str(c): round(simulate.hit_ratio(trace, policy, c), 4) for c in CAPACITIES}
            for policy in POLICIES
        }
    return result


def run() -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="kvbench-", dir="/tmp"))
    try:
        result: dict[str, Any] = bandwidth(root)
        result["ttft_s"] = ttft(root)
        result["hit_ratio"] = hit_ratios()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result["ratios"] = ratios(result)
    result["block_bytes"] = int(torch.empty(BLOCK_SHAPE, dtype=DTYPE).numel() * 2)
    result["summary"] = summary(result)
    return result


def ratios(result: dict[str, Any]) -> dict[str, float]:
    def r(a: float, b: float) -> float:
        return round(a / b, 3) if b else 0.0

    out = {
        "dram_put_over_memcpy": r(result["dram_put_gbps"], result["memcpy_gbps"]),
        "dram_get_over_memcpy": r(result["dram_get_gbps"], result["memcpy_gbps"]),
        "nvme_read_over_file_read": r(result["nvme_read_gbps"], result["file_read_gbps"]),
        "nvme_write_over_file_write": r(result["nvme_write_gbps"], result["file_write_gbps"]),
    }
    for name, times in result["ttft_s"].items():
        for tier in ("hbm", "dram", "nvme"):
            out[f"ttft_{name}_cold_over_{tier}"] = r(times["cold"], times[tier])
    return out


def summary(result: dict[str, Any]) -> str:
    t = result["ttft_s"]["16k"]
    return (
        f"dram put/get {result['dram_put_gbps']}/{result['dram_get_gbps']} GB/s "
        f"(memcpy {result['memcpy_gbps']}), "
        f"nvme r/w {result['nvme_read_gbps']}/{result['nvme_write_gbps']} GB/s "
        f"(file {result['file_read_gbps']}/{result['file_write_gbps']}), "
        f"16k TTFT cold {t['cold']}s hbm {t['hbm']}s dram {t['dram']}s nvme {t['nvme']}s"
    )
