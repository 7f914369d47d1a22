"""What limits a service right now: a verdict with the numbers behind it (pure).

From one interval's aggregate over the service's ready pods (``signals.Aggregate``):

- ``engine_busy``: share of wall time the engines spent in steps that had work (mean per pod);
- ``tier_wait_share``: share of that step time spent waiting on the KV-tier sidecar (lookups,
  loads, saves);
- ``kv_cache_usage``: mean share of HBM KV blocks held by running requests;
- ``preemptions_per_s`` and ``hbm_evictions_per_s``: requests preempted for lack of KV blocks,
  cached blocks pushed out of HBM to make room (per pod-second).

The rules, first match wins (docs/operator.md, "Bottleneck diagnosis", says what to do about
each):

1. ``Idle``: no prompt token and no first token in the interval, engines (almost) never busy;
2. ``DataPathBound``: waiting on tier loads and saves is at least ``tier_wait_share`` of step time;
3. ``HBMBound``: KV usage at least ``kv_high`` with preemptions or HBM evictions: the batch is
   capped by KV blocks, not by compute. The engine may well be busy then, but much of that is
   recomputing the prefixes HBM evicted (measured: a ``tiny`` CPU worker with a 128-block budget,
   95% busy at 39 evictions/s), which more compute would not fix;
4. ``ComputeBound``: engines busy at least ``busy`` of the time, with KV to spare (or no
   preemption or eviction);
5. ``Headroom``: serving, none of the above: nothing limits it yet.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from strata.operator.autoscale.signals import Aggregate

Verdict = Literal["Idle", "DataPathBound", "HBMBound", "ComputeBound", "Headroom"]
VERDICTS: tuple[Verdict, ...] = ("Idle", "DataPathBound", "HBMBound", "ComputeBound", "Headroom")


@dataclass(frozen=True)
class Thresholds:
    busy: float = 0.85  # engine saturated at or above this share of wall time
    kv_high: float = 0.9  # HBM KV usage that counts as full
    tier_wait_share: float = 0.2  # share of step time waiting on the tiers that counts as significant
    idle_busy: float = 0.05  # below this, an interval without traffic is idle


DEFAULT = Thresholds()


@dataclass(frozen=True)
class Diagnosis:
    verdict: Verdict
    reason: str
    engine_busy: float | None
    tier_wait_share: float | None
    kv_cache_usage: float | None
    preemptions_per_s: float
    hbm_evictions_per_s: float


def rates(agg: Aggregate) -> tuple[float | None, float | None, float, float]:
    """(engine busy, tier-wait share, preemptions/s, HBM evictions/s) over the interval."""
    if agg.pod_seconds <= 0:
        return None, None, 0.0, 0.0
    busy_s = agg.engine.get("busy_s", 0.0)
    busy = min(1.0, busy_s / agg.pod_seconds) if "busy_s" in agg.engine else None
    wait = min(1.0, agg.engine.get("tier_wait_s", 0.0) / busy_s) if busy_s > 0 else None
    per_s = 1.0 / agg.pod_seconds
    return (
        busy,
        wait,
        agg.engine.get("preemptions", 0.0) * per_s,
        agg.engine.get("hbm_evictions", 0.0) * per_s,
    )


def diagnose(agg: Aggregate, t: Thresholds = DEFAULT) -> Diagnosis | None:
    """The verdict for one interval; None when the pods expose no engine counters yet."""
    busy, wait, preempt, evict = rates(agg)
    if busy is None:
        return None
    kv = agg.kv_cache_usage
    verdict, reason = _decide(busy, wait, kv, preempt + evict, agg.had_traffic, t)
    return Diagnosis(verdict, reason, busy, wait, kv, preempt, evict)


def _decide(
    busy: float, wait: float | None, kv: float | None, pressure: float, traffic: bool, t: Thresholds
) -> tuple[Verdict, str]:
    pct = _pct
    if not traffic and busy < t.idle_busy:
        return "Idle", f"no requests; engine busy {pct(busy)}"
    if wait is not None and wait >= t.tier_wait_share:
        return (
            "DataPathBound",
            f"tier loads and saves take {pct(wait)} of step time (>= {pct(t.tier_wait_share)})",
        )
    if kv is not None and kv >= t.kv_high and pressure > 0:
        return "HBMBound", (
            f"KV cache {pct(kv)} full with {pressure:.2f} preemptions+evictions/s (engine busy {pct(busy)})"
        )
    if busy >= t.busy:
        kv_text = f", KV cache {pct(kv)}" if kv is not None else ""
        return "ComputeBound", f"engine busy {pct(busy)} (>= {pct(t.busy)}){kv_text}"
    return "Headroom", f"engine busy {pct(busy)}, KV cache {pct(kv) if kv is not None else 'unknown'}"


def _pct(value: float) -> str:
    return f"{value * 100:.0f}%"
