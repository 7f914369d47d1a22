"""The router's Prometheus metrics, in their own registry (``GET /metrics``).

Counters and histograms are observed by the request path; gauges about endpoints, event streams
and waiting requests are read from the live objects at scrape time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from strata.common.hold import HELD_REQUESTS_METRIC
from strata.router.fleet import Fleet
from strata.router.gate import Gate

P = "strata_router_"
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class LiveCollector(Collector):
    def __init__(self, fleet: Fleet, gate: Gate, clock: Callable[[], float] = time.monotonic) -> None:
        self.fleet, self.gate, self.clock = fleet, gate, clock
        self.lookahead: Callable[[], int] = lambda: 0  # set once the look-ahead runs (``announce``)

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            HELD_REQUESTS_METRIC, "Requests held while the service has no ready replica.", self.gate.held()
        )
        yield GaugeMetricFamily(
            P + "queued_requests", "Requests waiting for a free replica slot.", self.gate.queued()
        )
        yield GaugeMetricFamily(
            P + "lookahead_requests",
            "Queued requests in the sets last sent to the replicas' sidecars (look-ahead).",
            self.lookahead(),
        )
        endpoints = GaugeMetricFamily(P + "endpoints", "Worker endpoints by state.", labels=["state"])
        for state, count in self.fleet.states(self.clock()).items():
            endpoints.add_metric([state], count)
        yield endpoints
        streams = GaugeMetricFamily(
            P + "event_streams", "Block-event streams by source and state.", labels=["source", "state"]
        )
        counts: dict[tuple[str, str], int] = {}
        for endpoint in self.fleet.endpoints.values():
            for source, synced in endpoint.view.synced.items():
                if source in endpoint.address.events:
                    key = (source, "synced" if synced else "down")
                    counts[key] = counts.get(key, 0) + 1
        for (source, state), count in sorted(counts.items()):
            streams.add_metric([source, state], count)
        yield streams
        follow = self.fleet.follow
        yield GaugeMetricFamily(
            P + "followed_blocks",
            "Lower-tier block keys followed from all replicas' streams.",
            follow.followed,
        )
        yield CounterMetricFamily(
            P + "unfollowed_blocks",
            "Lower-tier block keys not followed: past routing.max_followed_blocks.",
            follow.refused,
        )


class RouterMetrics:
    def __init__(self, fleet: Fleet, gate: Gate) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter(
            P + "requests", "Requests by route reason and HTTP status.", ["reason", "code"], registry=r
        )
        self.queue = Histogram(
            P + "queue_seconds",
            "Time waiting at the router, by priority.",
            ["priority"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            P + "time_to_first_token_seconds",
            "Arrival at the router to the first byte of the response body (the first token when streamed).",
            ["stream"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.latency = Histogram(
            P + "request_seconds",
            "Arrival at the router to the end of the response.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.predicted_cached = Counter(
            P + "predicted_cached_tokens",
            "Prompt tokens the router predicted cached where it sent them "
            "(requests whose worker reported usage).",
            registry=r,
        )
        self.cached = Counter(
            P + "cached_tokens",
            "Prompt tokens the workers reported served from a cache "
            "(usage.prompt_tokens_details.cached_tokens).",
            registry=r,
        )
        self.retries = Counter(
            P + "retries", "Requests moved to the next endpoint before any byte.", ["cause"], registry=r
        )
        self.endpoint_failures = Counter(
            P + "endpoint_failures", "Endpoints marked down, by cause.", ["cause"], registry=r
        )
        self.live = LiveCollector(fleet, gate)
        self.registry.register(self.live)

    def render(self) -> bytes:
        return bytes(generate_latest(self.registry))
