"""What a replay's clients saw, reduced to the figures the demo and the tests report (pure)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Outcome:
    """One request as its client saw it."""

    sent_s: float  # since the replay started
    prompt_tokens: int
    ttft_s: float | None = None  # None: no token arrived
    e2e_s: float | None = None
    cached_tokens: int = 0  # usage.prompt_tokens_details.cached_tokens
    error: str | None = None  # None: the response completed


@dataclass(frozen=True)
class Summary:
    requests: int
    errors: int
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    slo_attainment: float | None  # share of requests with a first token within the target
    cached_ratio: float | None  # cached prompt tokens / prompt tokens of completed requests


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in [0, 1]); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def summarize(outcomes: Sequence[Outcome], ttft_target_s: float) -> Summary:
    """An errored request counts against the SLO: its client never got a timely first token."""
    ttfts = [o.ttft_s for o in outcomes if o.error is None and o.ttft_s is not None]
    done = [o for o in outcomes if o.error is None]
    prompt = sum(o.prompt_tokens for o in done)
    return Summary(
        requests=len(outcomes),
        errors=sum(o.error is not None for o in outcomes),
        ttft_p50_s=percentile(ttfts, 0.5),
        ttft_p95_s=percentile(ttfts, 0.95),
        slo_attainment=sum(t <= ttft_target_s for t in ttfts) / len(outcomes) if outcomes else None,
        cached_ratio=sum(o.cached_tokens for o in done) / prompt if prompt else None,
    )
