"""Waking a service scaled to zero: its routers hold requests while no replica is ready and count
them (``strata_router_held_requests``); the autoscaler reads that count from the ready router pods
(from the operator's watch cache, like the worker pods) and scales the service to one, or by the
tier's scale-up step more when they hold more than one replica takes in flight
(``decide.backlog``). The router itself has no write permission.

``wake_to`` is the decision (pure); ``wake`` is the autoscaler loop's hook.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Protocol

from prometheus_client.parser import text_string_to_metric_families

from strata.common.endpoints import ROUTER_PORT
from strata.common.hold import HELD_REQUESTS_METRIC
from strata.operator.api.models import InferenceServiceSpec
from strata.operator.autoscale.apicalls import ApiCalls
from strata.operator.autoscale.decide import History, Policy, backlog
from strata.operator.autoscale.metrics import MetricsError
from strata.operator.autoscale.pods import metrics_url
from strata.operator.autoscale.scrape import Scraper
from strata.operator.events import EventSink
from strata.operator.replicas import desired_replicas
from strata.operator.views import IndexViews

log = logging.getLogger(__name__)


def held_in(text: str) -> float:
    """The held-requests gauge of one router's exposition (0 when absent)."""
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == HELD_REQUESTS_METRIC:
                    return float(sample.value)
    except (ValueError, TypeError, IndexError) as exc:
        raise MetricsError(f"not Prometheus text exposition: {exc}") from None
    return 0.0


def current_replicas(spec: Mapping[str, Any]) -> int:
    minimum, maximum = int(spec.get("minReplicas", 1)), int(spec.get("maxReplicas", 1))
    return desired_replicas(int(spec.get("replicas", 1)), minimum, maximum)


def wake_to(spec: Mapping[str, Any], held: float, policy: Policy | None = None) -> int | None:
    """Replicas to scale a service at zero to when its routers hold requests; None otherwise.
    One (or minReplicas), or with the tier's ``policy``, its scale-up step more when they hold
    more requests than one replica takes in flight (``decide.backlog``)."""
    if current_replicas(spec) > 0 or held <= 0:
        return None
    first = min(int(spec.get("maxReplicas", 1)), max(1, int(spec.get("minReplicas", 1))))
    more = backlog(first, held, policy) if policy is not None else None
    return more if more is not None else first


class Scaler(Protocol):
    """What ``wake`` uses of the autoscaler loop (``loop.Autoscaler``)."""

    @property
    def views(self) -> IndexViews: ...

    @property
    def events(self) -> EventSink: ...

    @property
    def clock(self) -> Callable[[], float]: ...

    @property
    def histories(self) -> dict[str, History]: ...

    @property
    def scraper(self) -> Scraper: ...

    @property
    def api(self) -> ApiCalls: ...


async def held_requests(scaler: Scaler, isvc: Mapping[str, Any]) -> float:
    """Requests held by the service's ready routers; a router that cannot be scraped counts 0."""
    meta = isvc["metadata"]
    routers = scaler.views.ready_routers((meta["namespace"], meta["name"]))
    urls = [metrics_url(r.ip, ROUTER_PORT) for r in routers]
    texts = await asyncio.gather(*(scaler.scraper.get_text(url) for url in urls))
    total = 0.0
    for text in texts:
        try:
            total += held_in(text) if text is not None else 0.0
        except MetricsError as exc:
            log.debug("autoscaler: router metrics unreadable: %s", exc)
    return total


async def wake(scaler: Scaler, isvc: Mapping[str, Any], uid: str) -> bool:
    """Scale a service at zero whose routers hold requests to one; True when it did."""
    spec = isvc.get("spec", {})
    if current_replicas(spec) > 0:
        return False  # not at zero: nothing to scrape for
    held = await held_requests(scaler, isvc)
    target = wake_to(spec, held, _policy(scaler, spec))
    if target is None:
        return False
    reason = f"{held:.0f} requests held at the router while at zero: 0 -> {target}"
    await scaler.api.merge_patch(isvc, "scale", {"spec": {"replicas": target}})
    when = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    last = {"time": when, "fromReplicas": 0, "toReplicas": target, "reason": reason}
    await scaler.api.patch_status(isvc, {"lastScaling": last})
    # the held requests are traffic: the idle clock restarts, so the service is not put back to
    # zero before its new replica has served them
    now = scaler.clock()
    scaler.histories.setdefault(uid, History(started=now)).last_traffic = now
    scaler.events(isvc, "Normal", "Scaled", reason)
    log.info("autoscaler: %s/%s %s", isvc["metadata"]["namespace"], isvc["metadata"]["name"], reason)
    return True


def _policy(scaler: Scaler, spec: Mapping[str, Any]) -> Policy | None:
    """The service's tier policy; None when the tier is missing or invalid (then one replica)."""
    tier = scaler.views.tier(InferenceServiceSpec.tier_of(spec))
    try:
        return Policy.of(tier.get("spec"), spec) if tier is not None else None
    except ValueError:
        return None
