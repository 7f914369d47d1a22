"""A request's life in the fleet (``Seq``), what each replica counts the way the worker's
``/metrics`` does (``Tally``), and the outcome of every request (``Outcome``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from strata.operator.autoscale.metrics import PodSample
from strata.sim.tiers import Key
from strata.sim.trace import Request

# The worker's TTFT histogram buckets (worker/server/metrics.py LATENCY_BUCKETS), which the
# autoscaler's p95 is interpolated from. That module imports the engine (torch); the test in
# tests/sim/test_signals.py keeps this copy equal to it.
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# queue_full / queue_timeout: the worker's queue or the router's (429); hold_full / hold_timeout:
# the router's hold while the service had no ready replica (503).
Result = Literal["ok", "queue_full", "queue_timeout", "hold_full", "hold_timeout", "too_long", "unfinished"]
REFUSALS: tuple[Result, ...] = ("queue_full", "queue_timeout", "hold_full", "hold_timeout", "too_long")


@dataclass(eq=False)
class Seq:
    req: Request
    keys: tuple[Key, ...]
    arrival_s: float  # at the service (the user's clock)
    replica_arrival_s: float = 0.0  # at the replica serving it (the worker's clock)
    computed: int = 0
    generated: int = 0
    block_ids: list[int] = field(default_factory=list)
    published: int = 0
    admitted_s: float | None = None
    first_token_s: float | None = None
    hit_tokens: dict[str, int] = field(default_factory=dict)
    lone_ttft_s: float | None = None  # its TTFT alone on an idle replica, with the hits it found
    preemptions: int = 0
    retries: int = 0

    @property
    def length(self) -> int:
        return self.req.input_tokens + self.generated

    def reset(self) -> None:
        """Recompute-style preemption: the KV is gone; the answer so far is kept."""
        self.block_ids = []
        self.computed = 0
        self.published = 0


@dataclass(frozen=True, slots=True)
class Outcome:
    arrival_s: float
    result: Result
    ttft_s: float | None
    end_s: float
    input_tokens: int
    output_tokens: int
    hit_tokens: tuple[tuple[str, int], ...]
    lone_ttft_s: float | None
    tpot_s: float | None


class Outcomes:
    """Every request of one service, as it ended."""

    def __init__(self) -> None:
        self.items: list[Outcome] = []

    def add(self, seq: Seq, result: Result, now: float) -> None:
        ttft = seq.first_token_s - seq.arrival_s if seq.first_token_s is not None else None
        tpot = None
        if result == "ok" and seq.first_token_s is not None and seq.req.output_tokens > 1:
            tpot = (now - seq.first_token_s) / (seq.req.output_tokens - 1)
        self.items.append(
            Outcome(
                seq.arrival_s,
                result,
                ttft,
                now,
                seq.req.input_tokens,
                seq.req.output_tokens,
                tuple(sorted(seq.hit_tokens.items())),
                seq.lone_ttft_s,
                tpot,
            )
        )


class Tally:
    """One replica's counters, cumulative since it started, as its ``/metrics`` would show."""

    def __init__(self, outcomes: Outcomes) -> None:
        self.outcomes = outcomes
        self.prompt_tokens = 0
        self.hit_tokens: dict[str, float] = {}
        self.ttft_counts = [0] * (len(TTFT_BUCKETS) + 1)
        self.first_tokens = 0
        self.preemptions = 0
        self.prefill_busy_s = 0.0  # time in steps that computed prompt tokens, as the worker counts it

    def admitted(self, seq: Seq) -> None:
        self.prompt_tokens += seq.req.input_tokens
        for tier, tokens in seq.hit_tokens.items():
            self.hit_tokens[tier] = self.hit_tokens.get(tier, 0) + tokens

    def first_token(self, seq: Seq) -> None:
        assert seq.first_token_s is not None
        seconds = seq.first_token_s - seq.replica_arrival_s
        self.ttft_counts[_bucket(seconds)] += 1
        self.first_tokens += 1

    def finish(self, seq: Seq, now: float) -> None:
        self.outcomes.add(seq, "ok", now)

    def refuse(self, seq: Seq, reason: Result, now: float) -> None:
        self.outcomes.add(seq, reason, now)

    def sample(self, kv_usage: float, waiting: int) -> PodSample:
        """What a scrape of this replica's ``/metrics`` returns, parsed."""
        running = 0
        buckets: list[tuple[float, float]] = []
        for bound, count in zip((*TTFT_BUCKETS, float("inf")), self.ttft_counts, strict=True):
            running += count
            buckets.append((bound, float(running)))
        return PodSample(
            kv_usage=kv_usage,
            requests_waiting=float(waiting),
            ttft_buckets=tuple(buckets),
            ttft_count=float(self.first_tokens),
            prefix_hit_tokens=dict(self.hit_tokens),
            prompt_tokens=float(self.prompt_tokens),
            engine={"prefill_busy_s": self.prefill_busy_s},
        )


def _bucket(seconds: float) -> int:
    for i, bound in enumerate(TTFT_BUCKETS):
        if seconds <= bound:
            return i
    return len(TTFT_BUCKETS)
