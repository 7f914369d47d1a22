"""What each service held and so cost, interval by interval: the verdict and the cost go to the
operator's metrics (``telemetry``), and every ``usage_write_interval_s`` the cost accrued is
added to each ServiceTier's status.usage, one write per tier, so a fleet at rest costs the API
server next to nothing."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from strata.operator.api.models import InferenceServiceSpec
from strata.operator.autoscale.apicalls import API_ERRORS, ApiCalls
from strata.operator.autoscale.bottleneck import Diagnosis
from strata.operator.autoscale.cost import Footprint, held_now, sizes_of, spec_versions, usage
from strata.operator.autoscale.telemetry import Telemetry

log = logging.getLogger(__name__)
USAGE_WRITE_INTERVAL_S = 600.0
TierOf = Callable[[str], Mapping[str, Any] | None]  # a ServiceTier's body by name, from the cache


@dataclass
class Accounting:
    api: ApiCalls
    telemetry: Telemetry
    clock: Callable[[], float]
    usage_write_interval_s: float = USAGE_WRITE_INTERVAL_S
    # uid -> (spec versions, sizes): resolving a service every interval was a tenth of the
    # operator's CPU with a few hundred services; its sizes change only with a spec.
    sizes: dict[str, tuple[tuple[Any, ...], Footprint | None]] = field(default_factory=dict)
    _usage_written_at: float | None = None

    def observe_replicas(self, isvc: Mapping[str, Any]) -> None:
        status = isvc.get("status") or {}
        state = self.telemetry.state(service_key(isvc), tier_name(isvc))
        state.desired = int(status.get("desiredReplicas") or 0)
        state.ready = int(status.get("readyReplicas") or 0)

    def account(
        self,
        isvc: Mapping[str, Any],
        tier: Mapping[str, Any] | None,
        seconds: float,
        diagnosis: Diagnosis | None,
    ) -> None:
        """The verdict for the metrics, and the interval's cost (what the service held)."""
        key, tier_name_ = service_key(isvc), tier_name(isvc)
        self.telemetry.state(key, tier_name_).diagnosis = diagnosis
        held = self._footprint(isvc, tier)
        if held is not None and seconds > 0:
            self.telemetry.accrue(key, tier_name_, usage(held, seconds))

    def scaled(self, isvc: Mapping[str, Any], current: int, replicas: int) -> None:
        self.telemetry.scaled(service_key(isvc), tier_name(isvc), current, replicas)

    def _footprint(self, isvc: Mapping[str, Any], tier: Mapping[str, Any] | None) -> Footprint | None:
        uid, versions = str(isvc["metadata"]["uid"]), spec_versions(isvc, tier)
        known = self.sizes.get(uid)
        if known is None or known[0] != versions:
            known = self.sizes[uid] = (versions, sizes_of(isvc, tier))
        return None if known[1] is None else held_now(known[1], isvc)

    async def write_usage(self, tier_of: TierOf) -> None:
        """Add the cost accrued since the last write to each ServiceTier's status.usage, onto the
        tier as the watch cache has it and under that resourceVersion: a write by another release
        (each adds its own namespaces' cost to the same cluster-scoped tier), or one the cache
        does not show yet, is never overwritten; the cost waits for the next interval instead."""
        now = self.clock()
        if self._usage_written_at is not None and now - self._usage_written_at < self.usage_write_interval_s:
            return
        self._usage_written_at = now
        for name, added in list(self.telemetry.unwritten.items()):
            tier = tier_of(name)
            try:
                done = tier is None or await self.api.add_usage(tier, added)
            except API_ERRORS as exc:
                log.warning("autoscaler: usage of ServiceTier %s not written this time: %s", name, exc)
                continue
            if done:  # written, or the tier is deleted: nothing to add it to
                self.telemetry.unwritten.pop(name, None)


def service_key(isvc: Mapping[str, Any]) -> tuple[str, str]:
    return str(isvc["metadata"]["namespace"]), str(isvc["metadata"]["name"])


def tier_name(isvc: Mapping[str, Any]) -> str:
    return InferenceServiceSpec.tier_of(isvc.get("spec"))
