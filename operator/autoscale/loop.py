"""The autoscaler's periodic loop: scrape every managed service's ready pods, write
``status.signals`` and ``status.bottleneck``, account the service's cost, and for
``autoscaling.mode: builtin`` scale through the scale subresource.

One background task, started by the operator at start-up (kopf timers and daemons would add
finalizers to every InferenceService). Each interval it asks the peering object whether this
replica is the active one; a standby only forgets what it knew. Previous scrapes live in memory,
keyed by service uid, so the first interval after a (re)start only primes them. Services, their
ready pods and tiers come from the operator's watch caches, and ``status.signals`` is written
only when a signal moved: an idle fleet costs the API server nothing here.

The loop decides and writes; its I/O is its parts': ``scrape`` reads the pods' metrics,
``apicalls`` reads the peering and patches status and scale, ``accounting`` keeps what each
service cost and adds it to its ServiceTier's status."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from strata.operator.autoscale import modelsize, wake
from strata.operator.autoscale.accounting import Accounting, tier_name
from strata.operator.autoscale.apicalls import API_ERRORS, ApiCalls, rfc3339
from strata.operator.autoscale.apicalls import Peering as Peering
from strata.operator.autoscale.backoff import ScrapeBackoff
from strata.operator.autoscale.bottleneck import Diagnosis, diagnose
from strata.operator.autoscale.decide import (
    UTILIZATION_WINDOW_S,
    Decision,
    History,
    Observation,
    Policy,
    decide,
    record_decision,
)
from strata.operator.autoscale.metrics import PodSample
from strata.operator.autoscale.scalein import ScaleIn
from strata.operator.autoscale.scrape import Scraper
from strata.operator.autoscale.signals import Aggregate, Scrape, aggregate
from strata.operator.autoscale.telemetry import Telemetry
from strata.operator.autoscale.volumes import VolumeWatch
from strata.operator.events import EventSink
from strata.operator.kube import KubeClient
from strata.operator.replicas import desired_replicas
from strata.operator.views import IndexViews

log = logging.getLogger(__name__)
ServiceKey = tuple[str, str]


@dataclass
class Autoscaler:
    kube: KubeClient
    events: EventSink
    services: Callable[[], Iterable[ServiceKey]]  # the services this replica manages
    peering: Peering
    views: IndexViews = field(default_factory=IndexViews)
    clock: Callable[[], float] = time.monotonic
    scrapes: dict[str, Scrape] = field(default_factory=dict)
    histories: dict[str, History] = field(default_factory=dict)
    written: dict[str, dict[str, Any]] = field(default_factory=dict)  # uid -> signals last written
    models: dict[str, tuple[int | None, int]] = field(
        default_factory=dict
    )  # uid -> (spec's, workers') KV size
    # uid -> (resourceVersion the service had, replicas set): the watch cache may lag our own patch
    patched: dict[str, tuple[str | None, int]] = field(default_factory=dict)
    telemetry: Telemetry = field(default_factory=Telemetry)
    utilization_window_s: float = UTILIZATION_WINDOW_S
    api: ApiCalls = field(init=False)  # the API server: peering, status and scale patches
    scraper: Scraper = field(init=False)  # the pods' metrics
    accounting: Accounting = field(init=False)  # the verdicts and cost, for metrics and tiers
    scale_in: ScaleIn = field(init=False)
    volumes: VolumeWatch = field(init=False)  # full KV-tier volumes, told as Events

    def __post_init__(self) -> None:
        self.api = ApiCalls(self.kube)
        self.scraper = Scraper(lambda: self.clock())  # read when called: tests set a clock later
        self.accounting = Accounting(self.api, self.telemetry, lambda: self.clock())
        self.scale_in = ScaleIn(self.kube, self.scraper.get_text)
        self.volumes = VolumeWatch(lambda url: self.scraper.get_text(url))

    async def run(self, interval_s: float) -> None:
        while True:
            started = self.clock()
            try:
                await self.tick()
            except Exception:  # one bad interval must not end autoscaling for good
                log.exception("autoscaler interval failed")
            await asyncio.sleep(max(0.0, interval_s - (self.clock() - started)))

    async def tick(self) -> None:
        if not await self.api.active(self.peering):
            self.scrapes.clear()  # a standby's memory would be stale when it takes over
            self.histories.clear()
            self.written.clear()
            self.models.clear()
            self.patched.clear()
            self.accounting.sizes.clear()
            self.scraper.backoff = ScrapeBackoff()
            self.telemetry.deactivate()
            return
        self.telemetry.active = True
        keys = list(self.services())
        seen = await asyncio.gather(*(self.service(ns, name) for ns, name in keys))
        live = {uid for uid in seen if uid}
        for gone in (set(self.scrapes) | set(self.patched)) - live:
            self.scrapes.pop(gone, None)
            self.histories.pop(gone, None)
            self.written.pop(gone, None)
            self.models.pop(gone, None)
            self.patched.pop(gone, None)
            self.accounting.sizes.pop(gone, None)
        self.telemetry.forget({key for key, uid in zip(keys, seen, strict=True) if uid})
        self.scraper.interval_done()
        await self.accounting.write_usage(self.views.tier)

    async def close(self) -> None:
        await self.scraper.close()

    async def service(self, namespace: str, name: str) -> str | None:
        """One service's interval; returns its uid while it exists."""
        try:
            isvc = self.views.service((namespace, name))
            if isvc is None or isvc["metadata"].get("deletionTimestamp"):
                return None
            uid = str(isvc["metadata"]["uid"])
            if await wake.wake(self, isvc, uid):  # at zero, with requests held at its routers
                return uid
            pods = self.views.ready_pods((namespace, name))
            samples = await self.scraper.scrape_pods(pods)
            await self._report_model(isvc, uid, samples)
            await self.volumes.report(isvc, [p for p in pods if p.uid in samples], self.events)
            tier = self.views.tier(tier_name(isvc))
            now = self.clock()
            current = Scrape(now, samples)
            previous = self.scrapes.get(uid)
            self.scrapes[uid] = current
            self.accounting.observe_replicas(isvc)
            if previous is None:
                return uid  # priming: deltas need two scrapes
            self.scale_in.observe(previous, current)
            agg = aggregate(previous, current)
            diagnosis = diagnose(agg)
            self.accounting.account(isvc, tier, now - previous.time, diagnosis)
            await self._write_signals(isvc, agg, diagnosis)
            if (isvc.get("spec", {}).get("autoscaling") or {}).get("mode", "builtin") == "builtin":
                await self._scale(isvc, uid, agg, now, tier)
            return uid
        except API_ERRORS as exc:
            log.warning("autoscaler: %s/%s skipped this interval: %s", namespace, name, exc)
            return None

    async def _write_signals(
        self, isvc: Mapping[str, Any], agg: Aggregate, diagnosis: Diagnosis | None
    ) -> None:
        """Only when a signal or the verdict moved: an unchanged scrape is no news, whatever its
        timestamp."""
        uid = str(isvc["metadata"]["uid"])
        now = datetime.now(UTC)
        new = {"signals": signals_status(agg, now), "bottleneck": bottleneck_status(diagnosis, now)}
        before = self.written.get(uid) or {
            key: (isvc.get("status") or {}).get(key) for key in ("signals", "bottleneck")
        }
        if not any(signals_changed(before.get(key), new[key]) for key in new):
            return
        await self.api.patch_status(isvc, new)
        self.written[uid] = new

    async def _report_model(
        self, isvc: Mapping[str, Any], uid: str, samples: Mapping[str, PodSample]
    ) -> None:
        """status.model, and an Event, when the workers' KV size is new or the spec's changed."""
        seen = modelsize.reported(samples.values())
        told = ((isvc.get("spec") or {}).get("model") or {}).get("kvBytesPerToken")
        last = self.models.get(uid)
        if seen is None or last == (told, seen):
            return
        # what we wrote last (the watch cache may lag it), else what a predecessor wrote
        before = {"kvBytesPerToken": last[1]} if last else (isvc.get("status") or {}).get("model")
        status = modelsize.model_status(before, seen, rfc3339(datetime.now(UTC)))
        if status is not None:
            await self.api.patch_status(isvc, {"model": status})
        hint = modelsize.advice(told, seen)
        if hint is not None:
            self.events(isvc, hint.type, hint.reason, hint.message)
        self.models[uid] = (told, seen)

    async def _scale(
        self, isvc: Mapping[str, Any], uid: str, agg: Aggregate, now: float, tier: Mapping[str, Any] | None
    ) -> None:
        spec = isvc.get("spec", {})
        if tier is None:
            return  # the reconciler reports the missing tier; nothing to scale within
        try:
            policy = Policy.of(tier.get("spec"), spec)
            current = desired_replicas(
                replicas_now(isvc, self.patched.get(uid)),
                int(spec.get("minReplicas", 1)),
                int(spec.get("maxReplicas", 1)),
            )
        except ValueError as exc:  # the reconciler reports an invalid tier or spec as a condition
            meta = isvc["metadata"]
            log.warning("autoscaler: %s/%s not scaled: %s", meta["namespace"], meta["name"], exc)
            return
        history = self.histories.setdefault(uid, History(now, self.utilization_window_s))
        ready = len(self.scrapes[uid].pods)
        # woken, no replica ready yet: how many requests its routers hold says whether one is enough
        held = await wake.held_requests(self, isvc) if ready == 0 and current > 0 else 0.0
        seen = Observation.of(agg, ready_replicas=ready, requests_held=held)
        decision = decide(current, seen, policy, history, now)
        record_decision(history, now, current, seen, policy, decision)
        if decision.changes(current):
            await self._apply(isvc, current, decision)

    async def _apply(self, isvc: Mapping[str, Any], current: int, decision: Decision) -> None:
        meta = isvc["metadata"]
        if 0 < decision.replicas < current:  # the coldest pod goes first
            latest = self.scrapes.get(str(meta["uid"]))
            order = await self.scale_in.prepare(isvc, latest, self.clock())
            self.events(isvc, "Normal", "ScaleInOrder", order)
        await self.api.merge_patch(isvc, "scale", {"spec": {"replicas": decision.replicas}})
        self.patched[str(meta["uid"])] = (meta.get("resourceVersion"), decision.replicas)
        when = datetime.now(UTC)
        last = {
            "time": rfc3339(when),
            "fromReplicas": current,
            "toReplicas": decision.replicas,
            "reason": decision.reason[:1024],
        }
        await self.api.patch_status(isvc, {"lastScaling": last})
        self.accounting.scaled(isvc, current, decision.replicas)
        self.events(isvc, "Normal", "Scaled", decision.reason)
        log.info("autoscaler: %s/%s %s", meta["namespace"], meta["name"], decision.reason)


def replicas_now(isvc: Mapping[str, Any], patched: tuple[str | None, int] | None) -> int:
    """The service's replicas: ours if the watch cache still shows the version we patched (a
    loaded API server delivers the change seconds later; deciding again on the old count sent a
    second, identical scale-down), else what the cache says (anyone may have changed it since)."""
    if patched is not None and patched[0] == isvc["metadata"].get("resourceVersion"):
        return patched[1]
    return int(isvc.get("spec", {}).get("replicas", 1))


def signals_status(agg: Aggregate, now: datetime) -> dict[str, Any]:
    """status.signals on the wire; an unknown signal is null, which a merge patch removes."""
    return {
        "kvCacheUsage": round(agg.kv_cache_usage, 4) if agg.kv_cache_usage is not None else None,
        "ttftP95Ms": round(agg.ttft_p95_s * 1000, 1) if agg.ttft_p95_s is not None else None,
        "requestsWaiting": agg.requests_waiting,
        "prefixHitRatio": {t: round(r, 4) for t, r in agg.prefix_hit_ratio.items()} or None,
        "observedAt": rfc3339(now),
    }


def signals_changed(before: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> bool:
    """Whether any signal differs; the time of the scrape is not a change, and an unknown
    signal (null, removed by the merge patch) equals an absent one."""

    def known(signals: Mapping[str, Any] | None) -> dict[str, Any]:
        return {k: v for k, v in (signals or {}).items() if v is not None and k != "observedAt"}

    return known(before) != known(new)


def bottleneck_status(diagnosis: Diagnosis | None, now: datetime) -> dict[str, Any] | None:
    """status.bottleneck on the wire; None (a merge patch removes it) when undecided."""
    if diagnosis is None:
        return None

    def ratio(value: float | None) -> float | None:
        return round(value, 4) if value is not None else None

    return {
        "verdict": diagnosis.verdict,
        "reason": diagnosis.reason[:1024],
        "engineBusy": ratio(diagnosis.engine_busy),
        "tierWaitShare": ratio(diagnosis.tier_wait_share),
        "kvCacheUsage": ratio(diagnosis.kv_cache_usage),
        "preemptionsPerSecond": round(diagnosis.preemptions_per_s, 4),
        "hbmEvictionsPerSecond": round(diagnosis.hbm_evictions_per_s, 4),
        "observedAt": rfc3339(now),
    }
