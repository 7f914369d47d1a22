"""The hit-ratio table of the KV-tier benchmark: Strata's policies (the sidecar's own index,
eviction and admission code) next to reference implementations of the peers' policies and the
offline optimum, on both Mooncake traces, with the checks the policies are held to."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from strata.common.traces import traces_dir
from strata.worker.kvtier import reference, simulate

CAPACITIES = (1000, 5000, 10000, 30000)
LOOKAHEAD = 64  # queued requests the look-ahead sees, replayed in arrival order
SWEEP = (128, 256, 512)  # deeper queues (a router's), on the conversation trace at 5k blocks
EVICTION = "prefix-aware"  # the tiers' default eviction, under the admission rows
REPO = Path(__file__).resolve().parents[1]

Trace = Sequence[Sequence[int]]
Row = Callable[[Trace, int], float]

ROWS: dict[str, Row] = {
    "lru": lambda trace, c: simulate.hit_ratio(trace, c, "lru"),
    "prefix-aware": lambda trace, c: simulate.hit_ratio(trace, c, "prefix-aware"),  # leaf-LRU
    "tail-first": reference.tail_first,
    "lfu": reference.lfu,
    "s3-fifo": reference.s3_fifo,
    "doorkeeper": lambda trace, c: simulate.hit_ratio(trace, c, EVICTION, "doorkeeper"),
    "adaptive": lambda trace, c: simulate.hit_ratio(trace, c, EVICTION, "adaptive"),
    "adaptive+lookahead": lambda trace, c: simulate.hit_ratio(trace, c, EVICTION, "adaptive", LOOKAHEAD),
    "optimal": simulate.optimal_hit_ratio,
    # Not a policy: the ceiling of any eviction order behind the doorkeeper (Belady's eviction,
    # doorkeeper admission), which shows how much of the gap is admission's.
    "doorkeeper+optimal-eviction": lambda trace, c: simulate.optimal_hit_ratio(trace, c, doorkeeper=True),
    # Nor this: the same with the look-ahead's blocks admitted too.
    "doorkeeper+lookahead+optimal-eviction": lambda trace, c: simulate.optimal_hit_ratio(
        trace, c, doorkeeper=True, lookahead=LOOKAHEAD
    ),
    # Nor this: the same remembering every sighting (the doorkeeper's sketch forgets), the
    # ceiling of any policy that admits a first sighting only when a queued request announced it.
    "seen-before+lookahead+optimal-eviction": lambda trace, c: simulate.optimal_hit_ratio(
        trace, c, doorkeeper=True, lookahead=LOOKAHEAD, remember_all=True
    ),
}
PEERS = ("lru", "prefix-aware", "tail-first", "lfu", "s3-fifo")  # prefix-aware = SGLang's leaf-LRU


def table(trace: Trace) -> dict[str, dict[str, float]]:
    return {name: {str(c): round(row(trace, c), 4) for c in CAPACITIES} for name, row in ROWS.items()}


def shares(ratios: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """Each policy's hit ratio as a share of the offline optimum's."""
    optimum = ratios["optimal"]
    return {
        name: {c: round(r / optimum[c], 3) if optimum[c] else 0.0 for c, r in row.items()}
        for name, row in ratios.items()
    }


def checks(ratios: dict[str, dict[str, dict[str, float]]], sweep: dict[str, float]) -> dict[str, Any]:
    """Adaptive against the best peer at every capacity, its gain at 5k blocks on the
    conversation trace, and the look-ahead's share of the optimum there."""
    margin = {
        trace: {c: round(rows["adaptive"][c] - max(rows[p][c] for p in PEERS), 4) for c in rows["adaptive"]}
        for trace, rows in ratios.items()
    }
    conversation = ratios.get("mooncake_conversation.jsonl")
    out: dict[str, Any] = {"adaptive_minus_best_peer": margin, "lookahead_depth": LOOKAHEAD}
    if conversation:
        best = max(conversation[p]["5000"] for p in PEERS)
        out["adaptive_gain_over_best_peer_conversation_5k"] = round(
            conversation["adaptive"]["5000"] / best - 1, 3
        )
        optimum = conversation["optimal"]["5000"]
        out["lookahead_share_of_optimal_conversation_5k"] = round(
            conversation["adaptive+lookahead"]["5000"] / optimum, 3
        )
        out["doorkeeper_ceiling_share_of_optimal_conversation_5k"] = round(
            conversation["doorkeeper+optimal-eviction"]["5000"] / optimum, 3
        )
        out["doorkeeper_lookahead_ceiling_share_of_optimal_conversation_5k"] = round(
            conversation["doorkeeper+lookahead+optimal-eviction"]["5000"] / optimum, 3
        )
        out["seen_before_lookahead_ceiling_share_of_optimal_conversation_5k"] = round(
            conversation["seen-before+lookahead+optimal-eviction"]["5000"] / optimum, 3
        )
        out["lookahead_depth_sweep_share_of_optimal_conversation_5k"] = {
            depth: round(r / optimum, 3) for depth, r in sweep.items()
        }
    return out


def depth_sweep(trace: Trace) -> dict[str, float]:
    return {str(d): round(simulate.hit_ratio(trace, 5000, EVICTION, "adaptive", d), 4) for d in SWEEP}


def trace_paths() -> list[Path]:
    """The traces to replay; an error naming the directory when there are none (a table
    silently left empty would read as a result)."""
    paths = sorted(traces_dir().glob("*.jsonl"))
    if not paths:
        raise FileNotFoundError(f"no *.jsonl traces in {traces_dir()}: set STRATA_TRACES_DIR")
    return paths


def run() -> dict[str, Any]:
    ratios: dict[str, dict[str, dict[str, float]]] = {}
    sweep: dict[str, float] = {}
    for path in trace_paths():
        trace = simulate.load_trace(path)
        ratios[path.name] = table(trace)
        if "conversation" in path.name:
            sweep = depth_sweep(trace)
    return {
        "hit_ratio": ratios,
        "hit_ratio_share_of_optimal": {name: shares(rows) for name, rows in ratios.items()},
        "lookahead_depth_sweep_hit_ratio_conversation_5k": sweep,
        "policy_checks": checks(ratios, sweep),
    }
