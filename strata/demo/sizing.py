"""How the scaling act fits premium to this machine (pure).

The load is LOAD_SHARE of one replica's throughput, measured here and now (a closed loop through
the router that saturates one replica); a busier machine slows the replica and the measurement
alike, so the share, not the rate, is what the act holds. What a replica then spends computing
prompts - the autoscaler's prefillUtilization - is measured too (an open-loop probe at that
share, read from the replica's own counters), because with the `tiny` model most of a request's
cost is outside the engine (HTTP, the router, tokenising) and how much depends on the machine:
0.09 to 0.16 at half the throughput on a quiet two-core machine, 0.28 on a loaded one, where the
chart's premium tier scales up over 0.22 (its 0.2 and tolerance 0.1). So for the demo premium's
targetPrefillUtilization becomes the measured share divided by HEADROOM: one replica under the
load is then HEADROOM times over it and scales up, two are still over it and stay, and once the
load stops the utilization falls to nothing and premium scales back down. Batch keeps the chart's
0.7, which no replica of this load comes near."""

from __future__ import annotations

from dataclasses import dataclass

LOAD_SHARE = 0.6  # of one replica's throughput: a queue forms only in bursts
HEADROOM = 3.0  # one replica's prefill utilization under the load / premium's target for the demo
MIN_TARGET = 0.01  # below it the measured share is noise


class SizingError(RuntimeError):
    """The measured replica cannot show the act; the message says why."""


@dataclass(frozen=True)
class Measured:
    requests_per_s: float  # completions per second of one saturated replica
    utilization: float  # its prefill utilization at LOAD_SHARE of that rate


@dataclass(frozen=True)
class Sizing:
    rate_per_s: float  # the replay's
    premium_target: float  # premium's targetPrefillUtilization for the demo


def size(measured: Measured, batch_threshold: float) -> Sizing:
    """The replay rate and premium's target; refused when batch would scale under the same load
    (``batch_threshold``: its target times 1 + tolerance) or nothing was measured."""
    if measured.requests_per_s <= 0:
        raise SizingError("one replica completed no request while its throughput was measured")
    share = f"at {LOAD_SHARE:.2f} of its throughput a replica computed prompts {measured.utilization:.3f}"
    share += " of the time"
    if measured.utilization < MIN_TARGET * HEADROOM:
        raise SizingError(f"{share}: too little to size premium's target on")
    if measured.utilization * 2 >= batch_threshold:  # a machine twice as busy would scale batch
        raise SizingError(f"{share}: batch (threshold {batch_threshold:.2f}) could scale too")
    return Sizing(LOAD_SHARE * measured.requests_per_s, round(measured.utilization / HEADROOM, 3))
