"""A run's figures per service: the table row (text and JSON) and the time series for the plot.

SLO attainment is the share of *all* the service's requests whose time to first token was
within the tier's ``slo.ttftP95Ms`` (refused and unfinished requests count as misses). Since a
long prompt can take longer than the target on an idle replica, ``attainable`` is the share of
requests whose lone TTFT (alone on an idle replica, with the cache hits they found) is within
the target, and ``attainment_of_attainable`` the share of those that met it: the part of the
SLO that capacity decides.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from strata.common.tiers import TIERS
from strata.sim.requests import REFUSALS, Outcome
from strata.sim.run import RunResult
from strata.sim.service import Service

WINDOW_S = 60.0


def row(service: Service) -> dict[str, Any]:
    items = service.outcomes.items
    target = service.ttft_target_s
    ttfts = sorted(o.ttft_s for o in items if o.ttft_s is not None)
    met = sum(1 for o in items if o.ttft_s is not None and o.ttft_s <= target)
    possible = [o for o in items if o.lone_ttft_s is not None and o.lone_ttft_s <= target]
    met_possible = sum(1 for o in possible if o.ttft_s is not None and o.ttft_s <= target)
    return {
        "tier": service.config.tier,
        "requests": len(items),
        "refused": sum(1 for o in items if o.result in REFUSALS),
        "unfinished": sum(1 for o in items if o.result == "unfinished"),
        "slo_attainment": _ratio(met, len(items)),
        "attainable": _ratio(len(possible), len(items)),
        "attainment_of_attainable": _ratio(met_possible, len(possible)),
        "ttft_s": {f"p{q}": _quantile(ttfts, q / 100) for q in (50, 95, 99)},
        "tpot_p95_s": _quantile(sorted(o.tpot_s for o in items if o.tpot_s is not None), 0.95),
        "replica_seconds": round(service.replica_seconds, 1),
        "gpu_seconds": round(service.replica_seconds * service.config.gpus_per_replica, 1),
        "scaling_events": len(service.scalings),
        "hit_ratio": hit_ratios(items),
        "pod_preemptions": service.pod_preemptions,
        "retried_requests": service.retried,
    }


def hit_ratios(items: Sequence[Outcome]) -> dict[str, float]:
    prompt = sum(o.input_tokens for o in items if o.hit_tokens or o.lone_ttft_s is not None)
    hits: dict[str, int] = dict.fromkeys(TIERS, 0)
    for outcome in items:
        for tier, tokens in outcome.hit_tokens:
            hits[tier] = hits.get(tier, 0) + tokens
    return {tier: _ratio(tokens, prompt) for tier, tokens in hits.items()}


def summary(result: RunResult) -> dict[str, Any]:
    return {
        "policy": result.policy,
        "services": {s.name: row(s) for s in result.services},
        "replica_seconds": round(sum(s.replica_seconds for s in result.services), 1),
        "simulated_s": round(result.end_s, 1),
        "wall_s": round(result.wall_s, 2),
        "cpu_s": round(result.cpu_s, 2),
        "simulated_per_wall_s": round(result.speedup, 1),
    }


def series(service: Service) -> dict[str, list[float | None]]:
    """Replicas every sample, and TTFT p95 of the requests arriving in each minute."""
    by_window: dict[int, list[float]] = {}
    for outcome in service.outcomes.items:
        ttft = outcome.ttft_s if outcome.ttft_s is not None else math.inf
        by_window.setdefault(int(outcome.arrival_s // WINDOW_S), []).append(ttft)
    windows = sorted(by_window)
    out: dict[str, list[float | None]] = {
        "time_s": [s.time_s for s in service.samples],
        "replicas": [float(s.holding) for s in service.samples],
        "ready": [float(s.ready) for s in service.samples],
        "window_s": [(w + 0.5) * WINDOW_S for w in windows],
        "ttft_p95_s": [_quantile(sorted(by_window[w]), 0.95) for w in windows],
    }
    return out


def table(summaries: Sequence[dict[str, Any]]) -> str:
    header = (
        f"{'policy':<13} {'service':<10} {'tier':<8} {'reqs':>6} {'SLO':>6} {'(of att.)':>9} "
        f"{'p50 s':>7} {'p95 s':>7} {'p99 s':>7} {'refused':>7} {'replica-s':>10} {'scal.':>5}  "
        "hit hbm/dram/nvme/shared"
    )
    lines = [header, "-" * len(header)]
    for run in summaries:
        for name, r in run["services"].items():
            hits = "/".join(f"{r['hit_ratio'][t]:.2f}" for t in TIERS)
            ttft = r["ttft_s"]
            lines.append(
                f"{run['policy']:<13} {name:<10} {r['tier']:<8} {r['requests']:>6} "
                f"{r['slo_attainment']:>6.3f} {r['attainment_of_attainable']:>9.3f} "
                f"{_fmt(ttft['p50'])} {_fmt(ttft['p95'])} {_fmt(ttft['p99'])} "
                f"{r['refused'] + r['unfinished']:>7} {r['replica_seconds']:>10.0f} "
                f"{r['scaling_events']:>5}  {hits}"
            )
    return "\n".join(lines)


def _fmt(value: float | None) -> str:
    return f"{'-':>7}" if value is None or math.isinf(value) else f"{value:>7.2f}"


def _ratio(part: float, whole: float) -> float:
    return round(part / whole, 4) if whole else 0.0


def _quantile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank quantile of sorted values (inf stands for never served)."""
    if not values:
        return None
    value = values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))]
    return None if math.isinf(value) else round(value, 4)
