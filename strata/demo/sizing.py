"""How hard the scaling act pushes (pure): a share of one replica's measured throughput, chosen so
that the replica spends a set share of its time computing prompts - well over premium's
targetPrefillUtilization and well under batch's - on this machine, quiet or loaded.

Both figures are measured through the router, here and now: the throughput by a closed loop that
saturates one replica, the prefill utilization by an open-loop replay at PROBE_SHARE of that
throughput, read from the replica's own counters. Not at saturation: there every engine step
computes some prompt, so decode time counts as prompt time (measured: 0.62 saturated, then 0.26
at 0.68 of the throughput where 0.42 was expected). Utilization grows with the rate, so the probe
scales to the share that puts one replica at ``Band.aim``. A busier machine slows the replica
and the measurements alike: the share, not the rate, is what the act holds."""

from __future__ import annotations

import math
from dataclasses import dataclass

MAX_SHARE = 0.8  # of one replica's throughput: more would build a queue a batch replica never drains
PROBE_SHARE = 0.5  # the rate at which the prefill utilization is measured


class SizingError(RuntimeError):
    """The measured replica cannot be pushed between the two tiers' targets; the message says why."""


@dataclass(frozen=True)
class Measured:
    requests_per_s: float  # completions per second of one saturated replica
    probe_utilization: float  # its prefill utilization at PROBE_SHARE of that rate


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


def size(measured: Measured, band: Band) -> Sizing:
    """The replay rate that puts one replica at ``band.aim`` (at most MAX_SHARE of it)."""
    if measured.requests_per_s <= 0:
        raise SizingError("one replica completed no request while its throughput was measured")
    if band.low >= band.high:
        raise SizingError(f"premium's threshold {band.low:.2f} is not under batch's {band.high:.2f}")
    per_share = measured.probe_utilization / PROBE_SHARE
    share = min(MAX_SHARE, band.aim / per_share) if per_share > 0 else MAX_SHARE
    expected = share * per_share
    if expected <= band.low:
        raise SizingError(
            f"at {PROBE_SHARE:.2f} of its throughput a replica computed prompts only "
            f"{measured.probe_utilization:.2f} of the time: even at {share:.2f} it would stay under "
            f"premium's threshold {band.low:.2f} (longer prompts would help)"
        )
    return Sizing(share, share * measured.requests_per_s, expected)
