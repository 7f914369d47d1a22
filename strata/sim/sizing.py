"""Sizing the static baselines, per service, before a run.

``static_peak`` is provisioning for the peak: the fewest replicas that, held through the
trace's busiest ``PEAK_WINDOW_S`` (by prompt tokens), serve within the TTFT target as large a
share of the requests that can meet it at all (``attainment_of_attainable``) as the service's
``max_replicas`` do, within ``TOLERANCE``; found by bisection, simulating the service alone with
a GPU budget that never binds. (Over all requests, attainment keeps creeping up with the fleet's
total cache, which would put every static peak at ``max_replicas``.) ``static_mean``
scales that count by the trace's mean over peak prompt-token rate (one-minute windows), rounded
up (the mean taken over the whole run, the longest trace): provisioning for the average load.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from strata.sim.policies.static import Static
from strata.sim.report import row
from strata.sim.run import Scenario, simulate
from strata.sim.service import ServiceConfig
from strata.sim.trace import Trace

PEAK_WINDOW_S = 600.0
RATE_WINDOW_S = 60.0
TOLERANCE = 0.005


def static_sizes(scenario: Scenario) -> dict[str, dict[str, int]]:
    """{"static_peak": {service: N}, "static_mean": {service: N}}."""
    peak = {c.name: peak_replicas(scenario, c) for c in scenario.services}
    span = max(c.trace.span_s for c in scenario.services)
    mean = {c.name: mean_replicas(c.trace, peak[c.name], span) for c in scenario.services}
    return {"static_peak": peak, "static_mean": mean}


def peak_replicas(scenario: Scenario, config: ServiceConfig) -> int:
    start = busiest(config.trace, PEAK_WINDOW_S)
    window = replace(config, trace=config.trace.window(start, PEAK_WINDOW_S))

    def attainment(n: int) -> float:
        alone = replace(window, replicas=n, min_replicas=min(n, window.min_replicas), max_replicas=n)
        single = replace(scenario, services=(alone,), gpus=n * config.gpus_per_replica)
        result = simulate(single, "static", lambda s: Static("static", n, "sizing"))
        return float(row(result.services[0])["attainment_of_attainable"])

    return smallest(attainment, 1, config.max_replicas)


def smallest(attainment: Callable[[int], float], low: int, high: int) -> int:
    """The smallest n in [low, high] whose attainment is within TOLERANCE of high's
    (attainment grows with n, up to simulation noise)."""
    goal = attainment(high) - TOLERANCE
    while low < high:
        middle = (low + high) // 2
        if attainment(middle) >= goal:
            high = middle
        else:
            low = middle + 1
    return high


def busiest(trace: Trace, span_s: float) -> float:
    """Start of the ``span_s`` window (on a one-minute grid) with the most prompt tokens."""
    rates = token_rates(trace)
    size = max(1, round(span_s / RATE_WINDOW_S))
    if len(rates) <= size:
        return 0.0
    sums = [sum(rates[i : i + size]) for i in range(len(rates) - size + 1)]
    return sums.index(max(sums)) * RATE_WINDOW_S


def token_rates(trace: Trace, span_s: float | None = None) -> list[float]:
    """Prompt tokens per second in each one-minute window of [0, span_s] (default: the trace's)."""
    windows = [0.0] * (int(max(span_s or 0.0, trace.span_s) // RATE_WINDOW_S) + 1)
    for request in trace.requests:
        windows[int(request.arrival_s // RATE_WINDOW_S)] += request.input_tokens / RATE_WINDOW_S
    return windows


def mean_replicas(trace: Trace, peak: int, span_s: float | None = None) -> int:
    rates = token_rates(trace, span_s)
    full = rates[:-1] or rates  # the last window is partial
    return max(1, math.ceil(peak * (sum(full) / len(full)) / max(full)))
