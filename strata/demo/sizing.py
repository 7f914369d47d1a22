"""How hard the scaling act pushes (pure): a share of one replica's measured capacity, chosen so
that the replica spends a set share of its time computing prompts - well over premium's
targetPrefillUtilization and well under batch's - on this machine, quiet or loaded.

Capacity is measured, not assumed: a closed loop saturates one replica through its router, and
the replica's own counters say how much of that time its engine computed prompts (the rest is
HTTP, the router, tokenising: with the `tiny` model most of it). Prompt computation per request
does not depend on how busy the machine is, so replaying at ``share`` of the measured rate keeps
the engine computing prompts about ``share`` of the saturated share of the time. A busier machine
slows the replica and the measurement alike: the share, not the rate, is what the act holds."""

from __future__ import annotations

import math
from dataclasses import dataclass

MAX_SHARE = 0.8  # of one replica's throughput: more would build a queue a batch replica never drains


class SizingError(RuntimeError):
    """The measured replica cannot be pushed between the two tiers' targets; the message says why."""


@dataclass(frozen=True)
class Capacity:
    requests_per_s: float  # completions per second of one saturated replica
    prefill_utilization: float  # the share of that time its engine computed prompts


@dataclass(frozen=True)
class Band:
    """The prefill utilization a single replica should run at: over ``low`` (premium scales up),
    under ``high`` (batch does not). A tier scales one replica up once the ratio to its target is
    over 1 + tolerance; under it, ceil(1 * ratio) keeps one."""

    low: float
    high: float

    @classmethod
    def of(cls, low_target: float, low_tolerance: float, high_target: float, high_tolerance: float) -> Band:
        return cls(low_target * (1 + low_tolerance), high_target * (1 + high_tolerance))

    @property
    def aim(self) -> float:
        """The geometric middle: as many times over premium's threshold as under batch's."""
        return math.sqrt(self.low * self.high)


@dataclass(frozen=True)
class Sizing:
    share: float  # of one replica's throughput
    rate_per_s: float
    expected_utilization: float  # of one replica at that rate


def size(capacity: Capacity, band: Band) -> Sizing:
    """The replay rate that puts one replica at ``band.aim`` (at most MAX_SHARE of it)."""
    if capacity.requests_per_s <= 0:
        raise SizingError("one replica completed no request while its throughput was measured")
    if band.low >= band.high:
        raise SizingError(f"premium's threshold {band.low:.2f} is not under batch's {band.high:.2f}")
    saturated = capacity.prefill_utilization
    share = min(MAX_SHARE, band.aim / saturated) if saturated > 0 else MAX_SHARE
    expected = share * saturated
    if expected <= band.low:
        raise SizingError(
            f"a saturated replica computed prompts only {saturated:.2f} of the time: at {share:.2f} of its "
            f"throughput it would stay under premium's threshold {band.low:.2f} (longer prompts would help)"
        )
    return Sizing(share, share * capacity.requests_per_s, expected)
