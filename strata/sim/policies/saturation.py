"""A KV-usage threshold scaler: llm-d's saturation analyzer (workload-variant-autoscaler,
docs/saturation-analyzer.md) with its defaults.

Every reconcile (60 s) it reads each ready replica's peak KV-cache usage and queue length over
the last minute. Replicas below both thresholds (KV 0.80, queue 5) are non-saturated; their
spare capacity is threshold minus load. It adds one replica when the mean spare KV falls below
0.1 or the mean spare queue below 3 (or when every replica is saturated), but not while a
replica is still starting (the cascade guard); it removes one when, with the non-saturated load
spread over one replica fewer, both spares would still be at or above their triggers and at
least two replicas are non-saturated.
"""

from __future__ import annotations

from dataclasses import dataclass

from strata.sim.policies.base import Verdict, View
from strata.sim.service import PodState


@dataclass(frozen=True)
class Thresholds:
    kv_cache: float = 0.80
    queue_length: float = 5.0
    kv_spare_trigger: float = 0.1
    queue_spare_trigger: float = 3.0


class Saturation:
    name = "kv_threshold"
    interval_s = 5.0  # samples; decides every ``reconcile_s``
    reconcile_s = 60.0

    def __init__(self, thresholds: Thresholds | None = None) -> None:
        self.t = thresholds or Thresholds()
        self.peaks: dict[str, tuple[float, float]] = {}
        self.since = 0.0

    def decide(self, view: View) -> Verdict | None:
        for name, sample in view.scrapes().items():
            kv, queue = self.peaks.get(name, (0.0, 0.0))
            self.peaks[name] = (max(kv, sample.kv_usage or 0.0), max(queue, sample.requests_waiting or 0.0))
        if view.now - self.since < self.reconcile_s:
            return None
        peaks, self.peaks, self.since = self.peaks, {}, view.now
        live = {name for name in view.scrapes()}
        return self._verdict(view, [p for name, p in peaks.items() if name in live])

    def _verdict(self, view: View, peaks: list[tuple[float, float]]) -> Verdict | None:
        t = self.t
        free = [(kv, q) for kv, q in peaks if kv < t.kv_cache and q < t.queue_length]
        if not peaks:
            return None
        starting = view.count(PodState.PENDING, PodState.STARTING) > 0
        spare_kv = sum(t.kv_cache - kv for kv, _ in free) / len(free) if free else 0.0
        spare_q = sum(t.queue_length - q for _, q in free) / len(free) if free else 0.0
        if not free or spare_kv < t.kv_spare_trigger or spare_q < t.queue_spare_trigger:
            if starting:
                return None
            why = f"spare KV {spare_kv:.2f}, spare queue {spare_q:.1f} over {len(free)} non-saturated"
            return Verdict(view.bounded(view.desired + 1), why)
        if len(free) >= 2 and self._safe_without_one(free):
            return Verdict(view.bounded(view.desired - 1), "load fits one replica fewer")
        return None

    def _safe_without_one(self, free: list[tuple[float, float]]) -> bool:
        t, left = self.t, len(free) - 1
        kv = sum(k for k, _ in free) / left
        queue = sum(q for _, q in free) / left
        return t.kv_cache - kv >= t.kv_spare_trigger and t.queue_length - queue >= t.queue_spare_trigger
