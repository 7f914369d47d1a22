"""When to scrape a Ready pod's metrics again after its endpoint failed.

A pod can be Ready while its metrics endpoint refuses or times out (a server that lost its
port, a network policy, a node whose pods are simulated). Scraping it every interval costs
the operator a connection attempt (up to the scrape timeout) per pod per interval and tells
the decision nothing, as a failed scrape already counts as no sample. So each pod's failures
push its next scrape back, doubling from ``BACKOFF_BASE_S`` up to ``BACKOFF_CAP_S``; one
success clears them. The first failure or two cost nothing (the back-off is shorter than an
interval), so a pod that hiccups once is not skipped; one down for good is tried about every
two minutes, and is seen again within that when it recovers.

Pure: the loop passes the clock in."""

from __future__ import annotations

from dataclasses import dataclass, field

from strata.operator.backoff import Backoff

BACKOFF_BASE_S = 5.0
BACKOFF_CAP_S = 120.0
# Consecutive failures after which a pod's endpoint is reported (once, until it recovers).
REPORT_AFTER = 4


@dataclass
class ScrapeBackoff:
    """Consecutive failures and the earliest next scrape, per pod uid."""

    base_s: float = BACKOFF_BASE_S
    cap_s: float = BACKOFF_CAP_S
    _failures: dict[str, int] = field(default_factory=dict)
    _not_before: dict[str, float] = field(default_factory=dict)

    def due(self, pod: str, now: float) -> bool:
        """Whether ``pod`` may be scraped at ``now``."""
        return now >= self._not_before.get(pod, now)

    def failed(self, pod: str, now: float) -> int:
        """Record a failed scrape; returns the pod's consecutive failures."""
        count = self._failures.get(pod, 0) + 1
        self._failures[pod] = count
        self._not_before[pod] = now + self.delay_s(count)
        return count

    def succeeded(self, pod: str) -> int:
        """Record a successful scrape; returns how many failures it ended."""
        self._not_before.pop(pod, None)
        return self._failures.pop(pod, 0)

    def failures(self, pod: str) -> int:
        return self._failures.get(pod, 0)

    def delay_s(self, failures: int) -> float:
        """How long after its ``failures``-th failure in a row a pod waits: the API retries'
        doubling schedule, at its ceiling (no jitter: scrapes run only at the loop's ticks anyway)."""
        return Backoff(self.base_s, self.cap_s).ceiling(max(1, failures) - 1)

    def forget(self, keep: set[str]) -> None:
        """Drop pods no longer Ready anywhere (deleted, or not Ready: they come back fresh)."""
        for pod in set(self._failures) - keep:
            del self._failures[pod]
            self._not_before.pop(pod, None)
