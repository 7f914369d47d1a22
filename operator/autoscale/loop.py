"""The autoscaler's periodic loop: scrape every managed service's ready pods, write
``status.signals`` and ``status.bottleneck``, account the service's cost, and for
``autoscaling.mode: builtin`` scale through the scale subresource.

One background task, started by the operator at start-up (kopf timers and daemons would add
finalizers to every InferenceService). Each interval it asks the peering object whether this
replica is the active one; a standby only forgets what it knew. Previous scrapes live in memory,
keyed by service uid, so the first interval after a (re)start only primes them. Services, their
ready pods and tiers come from the operator's watch caches, and ``status.signals`` is written
only when a signal moved: an idle fleet costs the API server nothing here."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import aiohttp

from strata.common.endpoints import WORKER_PORT
from strata.operator import names
from strata.operator.api.models import InferenceServiceSpec
from strata.operator.autoscale import modelsize, wake
from strata.operator.autoscale.backoff import REPORT_AFTER, ScrapeBackoff
from strata.operator.autoscale.bottleneck import Diagnosis, diagnose
from strata.operator.autoscale.cost import (
    Footprint,
    Usage,
    held_now,
    merge_usage,
    sizes_of,
    spec_versions,
    usage,
)
from strata.operator.autoscale.decide import (
    UTILIZATION_WINDOW_S,
    Decision,
    History,
    Observation,
    Policy,
    decide,
    record_decision,
)
from strata.operator.autoscale.metrics import MetricsError, PodSample, parse_exposition
from strata.operator.autoscale.peering import is_active
from strata.operator.autoscale.pods import MERGE_PATCH, metrics_url
from strata.operator.autoscale.scalein import ScaleIn
from strata.operator.autoscale.signals import Aggregate, Scrape, aggregate
from strata.operator.autoscale.telemetry import Telemetry
from strata.operator.events import EventSink
from strata.operator.kube import KubeClient, KubeError, Obj, object_path
from strata.operator.replicas import desired_replicas
from strata.operator.views import IndexViews, PodRef

log = logging.getLogger(__name__)
# Its own field manager: the reconciler's server-side apply of status must not own (and so
# drop) the fields written here.
FIELD_MANAGER = "strata-autoscaler"
SCRAPE_TIMEOUT_S = 3.0
SCRAPE_CONCURRENCY = 32
API_ERRORS = (KubeError, aiohttp.ClientError, TimeoutError)
# How often the cost accrued in memory is added to each ServiceTier's status.usage: one write per
# tier per 10 minutes, so a fleet at rest costs the API server next to nothing.
USAGE_WRITE_INTERVAL_S = 600.0
ServiceKey = tuple[str, str]


@dataclass(frozen=True)
class Peering:
    """Where this replica's peering lives; None name: standalone, always active."""

    name: str | None
    priority: int


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
    # uid -> (spec versions, sizes): resolving a service every interval was a tenth of the
    # operator's CPU with a few hundred services; its sizes change only with a spec.
    sizes: dict[str, tuple[tuple[Any, ...], Footprint | None]] = field(default_factory=dict)
    telemetry: Telemetry = field(default_factory=Telemetry)
    backoff: ScrapeBackoff = field(default_factory=ScrapeBackoff)
    _ready_seen: set[str] = field(default_factory=set)  # pod uids Ready this interval
    usage_write_interval_s: float = USAGE_WRITE_INTERVAL_S
    utilization_window_s: float = UTILIZATION_WINDOW_S
    _usage_written_at: float | None = None
    _http: aiohttp.ClientSession | None = None
    _limit: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(SCRAPE_CONCURRENCY))
    scale_in: ScaleIn = field(init=False)

    def __post_init__(self) -> None:
        self.scale_in = ScaleIn(self.kube, self._get_text)

    async def run(self, interval_s: float) -> None:
        while True:
            started = self.clock()
            try:
                await self.tick()
            except Exception:  # one bad interval must not end autoscaling for good
                log.exception("autoscaler interval failed")
            await asyncio.sleep(max(0.0, interval_s - (self.clock() - started)))

    async def tick(self) -> None:
        if not await self._active():
            self.scrapes.clear()  # a standby's memory would be stale when it takes over
            self.histories.clear()
            self.written.clear()
            self.models.clear()
            self.patched.clear()
            self.sizes.clear()
            self.backoff = ScrapeBackoff()
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
            self.sizes.pop(gone, None)
        self.telemetry.forget({key for key, uid in zip(keys, seen, strict=True) if uid})
        self.backoff.forget(self._ready_seen)
        self._ready_seen = set()
        await self._write_usage()

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()

    async def service(self, namespace: str, name: str) -> str | None:
        """One service's interval; returns its uid while it exists."""
        try:
            isvc = self.views.service((namespace, name))
            if isvc is None or isvc["metadata"].get("deletionTimestamp"):
                return None
            uid = str(isvc["metadata"]["uid"])
            if await wake.wake(self, isvc, uid):  # at zero, with requests held at its routers
                return uid
            samples = await self._scrape_pods(namespace, name)
            await self._report_model(isvc, uid, samples)
            tier = self.views.tier(_tier_name(isvc))
            now = self.clock()
            current = Scrape(now, samples)
            previous = self.scrapes.get(uid)
            self.scrapes[uid] = current
            self._observe_replicas(isvc)
            if previous is None:
                return uid  # priming: deltas need two scrapes
            self.scale_in.observe(previous, current)
            agg = aggregate(previous, current)
            diagnosis = diagnose(agg)
            self._account(isvc, tier, now - previous.time, diagnosis)
            await self._write_signals(isvc, agg, diagnosis)
            if (isvc.get("spec", {}).get("autoscaling") or {}).get("mode", "builtin") == "builtin":
                await self._scale(isvc, uid, agg, now, tier)
            return uid
        except API_ERRORS as exc:
            log.warning("autoscaler: %s/%s skipped this interval: %s", namespace, name, exc)
            return None

    async def _active(self) -> bool:
        if self.peering.name is None:
            return True
        try:
            listed = await self.kube.request(
                "GET",
                "/apis/kopf.dev/v1/clusterkopfpeerings",
                params={"fieldSelector": f"metadata.name={self.peering.name}"},
            )
        except API_ERRORS as exc:
            log.warning("autoscaler: cannot read peering %s: %s", self.peering.name, exc)
            return False
        found: list[Obj] = listed.get("items", [])
        peers = (found[0].get("status") or {}) if found else {}
        return is_active(peers, self.peering.priority, datetime.now(UTC))

    async def _scrape_pods(self, namespace: str, name: str) -> dict[str, PodSample]:
        """Samples of the service's Ready pods, but those whose endpoint is backing off."""
        pods = self.views.ready_pods((namespace, name))
        self._ready_seen.update(p.uid for p in pods)
        now = self.clock()
        due = [p for p in pods if self.backoff.due(p.uid, now)]
        results = await asyncio.gather(*(self._scrape(p) for p in due))
        return {uid: sample for uid, sample in results if sample is not None}

    async def _scrape(self, pod: PodRef) -> tuple[str, PodSample | None]:
        url = metrics_url(pod.ip, WORKER_PORT)
        text = await self._get_text(url)
        try:
            sample = parse_exposition(text) if text is not None else None
        except MetricsError as exc:
            log.debug("autoscaler: metrics of %s (%s) unreadable: %s", pod.name, url, exc)
            sample = None
        self._scraped(pod, url, sample is not None)
        return pod.uid, sample

    def _scraped(self, pod: PodRef, url: str, ok: bool) -> None:
        """Back a failing endpoint off, and say so once when it keeps failing and when it answers."""
        if ok:
            if self.backoff.succeeded(pod.uid) >= REPORT_AFTER:
                log.info("autoscaler: metrics of pod %s (%s) answer again", pod.name, url)
            return
        failures = self.backoff.failed(pod.uid, self.clock())
        if failures == REPORT_AFTER:
            log.warning(
                "autoscaler: metrics of Ready pod %s (%s) failed %d times in a row; "
                "scraping it at most every %.0f s until it answers",
                pod.name,
                url,
                failures,
                self.backoff.cap_s,
            )

    async def _get_text(self, url: str) -> str | None:
        """GET under the scrape limit: the body, or None (logged at debug level) on any failure."""
        async with self._limit:
            try:
                async with self._session().get(url) as resp:
                    if resp.status != 200:
                        raise MetricsError(f"HTTP {resp.status}")
                    return await resp.text()
            except (aiohttp.ClientError, TimeoutError, MetricsError) as exc:
                log.debug("autoscaler: GET %s failed: %s", url, exc)
                return None

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_S))
        return self._http

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
        await self._patch_status(isvc, new)
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
        status = modelsize.model_status(before, seen, _rfc3339(datetime.now(UTC)))
        if status is not None:
            await self._patch_status(isvc, {"model": status})
        hint = modelsize.advice(told, seen)
        if hint is not None:
            self.events(isvc, hint.type, hint.reason, hint.message)
        self.models[uid] = (told, seen)

    def _observe_replicas(self, isvc: Mapping[str, Any]) -> None:
        status = isvc.get("status") or {}
        state = self.telemetry.state(_key(isvc), _tier_name(isvc))
        state.desired = int(status.get("desiredReplicas") or 0)
        state.ready = int(status.get("readyReplicas") or 0)

    def _account(
        self,
        isvc: Mapping[str, Any],
        tier: Mapping[str, Any] | None,
        seconds: float,
        diagnosis: Diagnosis | None,
    ) -> None:
        """The verdict for the metrics, and the interval's cost (what the service held)."""
        key, tier_name = _key(isvc), _tier_name(isvc)
        self.telemetry.state(key, tier_name).diagnosis = diagnosis
        held = self._footprint(isvc, tier)
        if held is not None and seconds > 0:
            self.telemetry.accrue(key, tier_name, usage(held, seconds))

    def _footprint(self, isvc: Mapping[str, Any], tier: Mapping[str, Any] | None) -> Footprint | None:
        uid, versions = str(isvc["metadata"]["uid"]), spec_versions(isvc, tier)
        known = self.sizes.get(uid)
        if known is None or known[0] != versions:
            known = self.sizes[uid] = (versions, sizes_of(isvc, tier))
        return None if known[1] is None else held_now(known[1], isvc)

    async def _write_usage(self) -> None:
        """Add the cost accrued since the last write to each ServiceTier's status.usage, onto the
        tier as the watch cache has it and under that resourceVersion: a write by another release
        (each adds its own namespaces' cost to the same cluster-scoped tier), or one the cache
        does not show yet, is never overwritten; the cost waits for the next interval instead."""
        now = self.clock()
        if self._usage_written_at is not None and now - self._usage_written_at < self.usage_write_interval_s:
            return
        self._usage_written_at = now
        for tier_name, added in list(self.telemetry.unwritten.items()):
            tier = self.views.tier(tier_name)
            try:
                done = tier is None or await self._add_usage(tier, added)
            except API_ERRORS as exc:
                log.warning("autoscaler: usage of ServiceTier %s not written this time: %s", tier_name, exc)
                continue
            if done:  # written, or the tier is deleted: nothing to add it to
                self.telemetry.unwritten.pop(tier_name, None)

    async def _add_usage(self, tier: Mapping[str, Any], added: Mapping[str, Usage]) -> bool:
        """False when the tier changed since the cache's copy (409 Conflict): nothing written."""
        meta = tier["metadata"]
        merged = merge_usage((tier.get("status") or {}).get("usage"), added, _rfc3339(datetime.now(UTC)))
        body = {"metadata": {"resourceVersion": meta["resourceVersion"]}, "status": {"usage": merged}}
        path = object_path(names.API_VERSION, names.TIER_KIND, meta["name"])
        try:
            await self._patch(f"{path}/status", body)
        except KubeError as exc:
            if exc.status == 409:
                log.info("autoscaler: ServiceTier %s changed since read; its usage waits", meta["name"])
                return False
            raise
        return True

    async def _patch_status(self, isvc: Mapping[str, Any], status: Mapping[str, Any]) -> None:
        await self._merge_patch(isvc, "status", {"status": status})

    async def _merge_patch(self, isvc: Mapping[str, Any], subresource: str, body: Mapping[str, Any]) -> None:
        """A merge patch of one of the service's subresources under the autoscaler's own manager."""
        meta = isvc["metadata"]
        path = object_path(names.API_VERSION, names.ISVC_KIND, meta["name"], meta["namespace"])
        await self._patch(f"{path}/{subresource}", body)

    async def _patch(self, path: str, body: Mapping[str, Any]) -> None:
        """A merge patch under the autoscaler's own field manager."""
        await self.kube.request(
            "PATCH", path, params={"fieldManager": FIELD_MANAGER}, body=body, content_type=MERGE_PATCH
        )

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
        await self._merge_patch(isvc, "scale", {"spec": {"replicas": decision.replicas}})
        self.patched[str(meta["uid"])] = (meta.get("resourceVersion"), decision.replicas)
        when = datetime.now(UTC)
        last = {
            "time": _rfc3339(when),
            "fromReplicas": current,
            "toReplicas": decision.replicas,
            "reason": decision.reason[:1024],
        }
        await self._patch_status(isvc, {"lastScaling": last})
        self.telemetry.scaled(_key(isvc), _tier_name(isvc), current, decision.replicas)
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
        "observedAt": _rfc3339(now),
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
        "observedAt": _rfc3339(now),
    }


def _key(isvc: Mapping[str, Any]) -> tuple[str, str]:
    return str(isvc["metadata"]["namespace"]), str(isvc["metadata"]["name"])


def _tier_name(isvc: Mapping[str, Any]) -> str:
    return InferenceServiceSpec.tier_of(isvc.get("spec"))


def _rfc3339(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")
