"""What the simulated replicas report is what the worker reports: the same TTFT buckets, and
scrapes the operator's own parser and aggregation accept."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from strata.operator.autoscale.signals import Scrape, aggregate
from strata.sim.requests import TTFT_BUCKETS, Outcomes, Seq, Tally
from tests.sim.helpers import trace

WORKER_METRICS = Path(__file__).resolve().parents[2] / "worker" / "server" / "metrics.py"


def test_the_ttft_buckets_are_the_workers():
    tree = ast.parse(WORKER_METRICS.read_text())
    found = [
        ast.literal_eval(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        and any(getattr(t, "id", "") == "LATENCY_BUCKETS" for t in node.targets)
    ]
    assert found == [TTFT_BUCKETS]


def test_a_replicas_scrapes_aggregate_like_a_workers():
    tally = Tally(Outcomes())
    (request,) = trace((0.0, 1000, 2, tuple(range(10)))).requests
    before = tally.sample(0.2, 0)
    for ttft in (0.1, 0.2, 0.3, 2.0):
        seq = Seq(request, (), 0.0, replica_arrival_s=0.0, hit_tokens={"hbm": 500})
        seq.first_token_s = ttft
        tally.admitted(seq)
        tally.first_token(seq)
    agg = aggregate(Scrape(0.0, {"pod": before}), Scrape(15.0, {"pod": tally.sample(0.6, 3)}))
    assert agg.kv_cache_usage == pytest.approx(0.6) and agg.requests_waiting == 3
    assert agg.prefix_hit_ratio == {"hbm": pytest.approx(0.5)}
    assert agg.ttft_p95_s is not None and 1.0 < agg.ttft_p95_s <= 2.5  # the 1-2.5 s bucket
