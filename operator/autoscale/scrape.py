"""The autoscaler's scrapes: each Ready pod's /metrics over HTTP, at most ``SCRAPE_CONCURRENCY``
at once and each within ``SCRAPE_TIMEOUT_S``; an endpoint that keeps failing is backed off
(``backoff.ScrapeBackoff``) and said so once, and once more when it answers again."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import aiohttp

from strata.common.endpoints import WORKER_PORT
from strata.operator.autoscale.backoff import REPORT_AFTER, ScrapeBackoff
from strata.operator.autoscale.metrics import MetricsError, PodSample, parse_exposition
from strata.operator.autoscale.pods import metrics_url
from strata.operator.views import PodRef

log = logging.getLogger(__name__)
SCRAPE_TIMEOUT_S = 3.0
SCRAPE_CONCURRENCY = 32


@dataclass
class Scraper:
    clock: Callable[[], float]
    backoff: ScrapeBackoff = field(default_factory=ScrapeBackoff)
    _ready_seen: set[str] = field(default_factory=set)  # pod uids Ready this interval
    _http: aiohttp.ClientSession | None = None
    _limit: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(SCRAPE_CONCURRENCY))

    async def scrape_pods(self, pods: Sequence[PodRef]) -> dict[str, PodSample]:
        """Samples of a service's Ready ``pods``, but those whose endpoint is backing off."""
        self._ready_seen.update(p.uid for p in pods)
        now = self.clock()
        due = [p for p in pods if self.backoff.due(p.uid, now)]
        results = await asyncio.gather(*(self._scrape(p) for p in due))
        return {uid: sample for uid, sample in results if sample is not None}

    def interval_done(self) -> None:
        """The pods not Ready this interval are forgotten, with their back-off."""
        self.backoff.forget(self._ready_seen)
        self._ready_seen = set()

    async def _scrape(self, pod: PodRef) -> tuple[str, PodSample | None]:
        url = metrics_url(pod.ip, WORKER_PORT)
        text = await self.get_text(url)
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

    async def get_text(self, url: str) -> str | None:
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

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
