"""Routing benchmark: how much of the KV cache each routing policy turns into hits, and at what
load balance, on the shared Mooncake traces (simulated, through the router's real choice
function); the same side by side on real processes (three real workers behind the real router,
round-robin against strata: ``routing_real``); and the shared tier's read bandwidth that the
router's tier weights derive from.

Shape: ``{"sim": {TRACE: {"4x5000": {POLICY: {"hit_ratio", "imbalance_p95"}}}}, "real": {POLICY:
{"cached_tokens", "ttft_p50_s", "ttft_p90_s", ...}}, "weights": ...}``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import routing_lookahead, routing_real, routing_sim
from strata.common.traces import traces_dir
from strata.router import weights
from strata.router.choose import Policy
from strata.worker.kvtier.shared import FilesystemBlockStore

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
FLEETS = ((4, 5000), (8, 5000))
SWEEP_TRACE, SWEEP_FLEET = "mooncake_conversation", (4, 5000)
BALANCE_WEIGHTS = (0.0, 0.03, 0.1, 0.3, 1.0)
SHARED_BLOCKS = 256
SHARED_BLOCK_BYTES = 16 * weights.MEASURED.kv_bytes_per_token  # one 16-token block of the small model


def traces() -> list[Path]:
    found = sorted(traces_dir().glob("*.jsonl"))
    if not found:
        raise RuntimeError(f"routing bench: no *.jsonl traces in {traces_dir()} (set STRATA_TRACES_DIR)")
    return found


def sim(policy: Policy) -> dict[str, dict[str, dict[str, dict[str, float]]]]:
    result: dict[str, dict[str, dict[str, dict[str, float]]]] = {}
    for path in traces():
        requests = routing_sim.load_requests(path)
        result[path.stem] = {
            f"{n}x{capacity}": {
                name: routing_sim.replay(requests, n, capacity, make())
                for name, make in routing_sim.pickers(policy).items()
            }
            for n, capacity in FLEETS
        }
    return result


def balance_sweep(policy: Policy) -> dict[str, dict[str, float]]:
    """The strata policy at other balance weights, on one trace and fleet: how the default sits."""
    requests = routing_sim.load_requests(traces_dir() / f"{SWEEP_TRACE}.jsonl")
    n, capacity = SWEEP_FLEET
    out: dict[str, dict[str, float]] = {}
    for weight in BALANCE_WEIGHTS:
        tuned = dataclasses.replace(policy, balance_weight=weight)
        out[str(weight)] = routing_sim.replay(requests, n, capacity, routing_sim.chooser(tuned, 0))
    return out


def shared_read_gbps(root: Path) -> float:
    """Reads of one file per block through the shared tier's own store, pages dropped first
    (best of three, the machine is shared)."""
    store = FilesystemBlockStore(root)
    data = memoryview(os.urandom(SHARED_BLOCK_BYTES))
    keys = [i.to_bytes(16, "big") for i in range(SHARED_BLOCKS)]
    for key in keys:
        store.write(key, b"\0" * 16, 0, data)
    out = memoryview(bytearray(SHARED_BLOCK_BYTES))
    best = float("inf")
    for _ in range(3):
        _drop_pages(root)
        started = time.perf_counter()
        for key in keys:
            if not store.read_into(key, out):
                raise RuntimeError("routing bench: the shared store lost a block")
        best = min(best, time.perf_counter() - started)
    return round(SHARED_BLOCKS * SHARED_BLOCK_BYTES / best / 1e9, 3)


def _drop_pages(root: Path) -> None:
    for path in root.rglob("*.kv"):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def tier_weights() -> dict[str, Any]:
    """Weights derived from this run's shared-tier reads and, where this machine has them, the
    kvtier and worker benchmarks' results (else the figures the defaults were derived from)."""
    root = Path(tempfile.mkdtemp(prefix="routing-shared-", dir="/tmp"))
    try:
        shared = shared_read_gbps(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    m = weights.MEASURED
    read = dict(m.read_gbps, shared=shared)
    prefill, source = m.prefill_tokens_per_s, m.source
    kvtier, worker = RESULTS / "kvtier.json", RESULTS / "worker.json"
    if kvtier.is_file() and worker.is_file():
        k, w = json.loads(kvtier.read_text()), json.loads(worker.read_text())
        read |= {"dram": k["dram_get_gbps"], "nvme": k["nvme_get_gbps"]}
        prefill, source = w["prefill_tok_s"]["4k"], "bench/results/kvtier.json and worker.json"
    derived = weights.derive(weights.Measurements(m.kv_bytes_per_token, prefill, read, source))
    return {
        "shared_read_gbps": shared,
        "read_gbps": read,
        "prefill_tok_s": prefill,
        "source": source,
        "derived": derived.model_dump(),
        "default": weights.DEFAULT_WEIGHTS.model_dump(),
    }


def run() -> dict[str, Any]:
    policy = Policy()
    result: dict[str, Any] = {"sim": sim(policy), "weights": tier_weights(), "real": routing_real.run()}
    result["lookahead"] = routing_lookahead.run()
    result["balance_weight_sweep"] = {
        f"{SWEEP_TRACE} {SWEEP_FLEET[0]}x{SWEEP_FLEET[1]}": balance_sweep(policy)
    }
    result["policy"] = {
        f.name: getattr(policy, f.name) for f in dataclasses.fields(policy) if f.name != "weights"
    }
    result["summary"] = summary(result)
    return result


def summary(result: dict[str, Any]) -> str:
    parts = []
    for trace, fleets in result["sim"].items():
        for fleet, policies in fleets.items():
            s, r = policies["strata"], policies["random"]
            gain = s["hit_ratio"] / r["hit_ratio"]
            parts.append(
                f"{trace} {fleet}: strata hit {s['hit_ratio']} ({gain:.2f}x random), "
                f"imbalance p95 {s['imbalance_p95']} vs {r['imbalance_p95']}"
            )
    real = result["real"]
    s, rr = real["strata"], real["round-robin"]
    parts.append(
        f"real: cached tokens strata {s['cached_tokens']} vs round-robin {rr['cached_tokens']} "
        f"({s['cached_tokens'] / max(1, rr['cached_tokens']):.2f}x), TTFT p50/p90 {s['ttft_p50_s']}/"
        f"{s['ttft_p90_s']} s vs {rr['ttft_p50_s']}/{rr['ttft_p90_s']} s"
    )
    long = result["lookahead"]["512_blocks"]
    parts.append(
        f"look-ahead, 1,024 queued 8k-token prompts: router {long['change']['router_ms_per_tick']} ms a tick "
        f"sending changes vs {long['whole']['router_ms_per_tick']} ms whole sets, "
        f"{long['whole_over_change']['bytes']}x fewer bytes"
    )
    return "; ".join(parts)
