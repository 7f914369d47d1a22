"""One replica's engine: step costs, prefix hits, batching, refusals, preemption, and the
decode shortcut agreeing with step-by-step simulation."""

from __future__ import annotations

import pytest

from strata.sim.engine import Engine
from strata.sim.service import Service
from tests.sim.helpers import FLAT, service, trace


def replay(svc: Service, until: float = 1000.0) -> Engine:
    engine = svc.new_engine(0.0)
    for request in svc.config.trace.requests:
        engine.advance(request.arrival_s)
        engine.submit(svc.seq(request, request.arrival_s), request.arrival_s)
    engine.advance(until)
    return engine


def test_a_lone_request_takes_its_chunked_prefill_then_one_step_per_token():
    svc = service(trace((0.0, 2500, 4, tuple(range(25)))))
    replay(svc)
    (done,) = svc.outcomes.items
    # 2,500 tokens in chunks of 1,000: three steps of 10 ms + 1 ms per 1,000 tokens.
    assert done.ttft_s is not None and done.ttft_s == pytest.approx(3 * 0.010 + 2500e-6)
    assert done.ttft_s == pytest.approx(FLAT.lone_prefill_s(2500))
    # Three more tokens, one decode step each (10 ms + 1 ms for the one sequence).
    assert done.end_s == pytest.approx(done.ttft_s + 3 * 0.011)
    assert done.result == "ok" and done.hit_tokens == (("hbm", 0),)


def test_a_repeated_prefix_is_served_from_hbm_but_never_the_last_token():
    blocks = (1, 2, 3, 4, 5)
    svc = service(trace((0.0, 500, 2, blocks), (10.0, 500, 2, blocks), (20.0, 450, 2, (1, 2, 9, 10, 11))))
    replay(svc)
    first, again, partial = svc.outcomes.items
    assert first.ttft_s is not None and again.ttft_s is not None
    assert dict(again.hit_tokens) == {"hbm": 400}  # (500 - 1) // 100 blocks: the last one is computed
    assert dict(partial.hit_tokens) == {"hbm": 200}  # the shared prefix 1, 2 only
    assert again.ttft_s < first.ttft_s


def test_arrivals_batch_together_and_each_decode_step_costs_per_sequence():
    svc = service(trace((0.0, 100, 3, (1,)), (0.0, 100, 3, (2,))))
    replay(svc)
    a, b = svc.outcomes.items
    assert a.ttft_s is not None
    # One prefill step for both (200 tokens), then two decode steps of two sequences.
    assert a.ttft_s == b.ttft_s == pytest.approx(0.010 + 200e-6)
    assert a.end_s == pytest.approx(a.ttft_s + 2 * 0.012)


def test_a_full_queue_refuses_and_a_long_wait_times_out():
    many = [(0.0, 1000, 50, (i * 10 + k for k in range(10))) for i in range(20)]
    svc = service(trace(*[(t, n, o, tuple(b)) for t, n, o, b in many]))
    replay(svc)
    results = [o.result for o in svc.outcomes.items]
    assert results.count("queue_full") > 0
    assert all(r in ("ok", "queue_full", "queue_timeout") for r in results)
    assert len(results) == 20  # every request ends somehow: nothing is dropped


def test_a_request_larger_than_hbm_is_refused_as_too_long():
    svc = service(trace((0.0, 10_500, 10, tuple(range(105)))))
    replay(svc)
    assert [o.result for o in svc.outcomes.items] == ["too_long"]


def test_running_out_of_blocks_preempts_the_latest_arrival_which_still_finishes():
    # 100 blocks; two sequences of 4,000 prompt tokens growing by 1,500 decode tokens each.
    svc = service(trace((0.0, 4000, 1500, tuple(range(40))), (0.0, 4000, 1500, tuple(range(100, 140)))))
    engine = replay(svc, until=10_000)
    assert engine.tally.preemptions >= 1
    assert sorted(o.result for o in svc.outcomes.items) == ["ok", "ok"]


def test_the_decode_shortcut_equals_stepping_one_step_at_a_time(monkeypatch):
    requests = [(i * 0.05, 300 + 37 * i, 40 + 11 * i, tuple(range(i * 10, i * 10 + 8))) for i in range(12)]

    def outcomes(shortcut: bool) -> list[float]:
        svc = service(trace(*requests))
        if not shortcut:
            monkeypatch.setattr(Engine, "_decode_only", lambda self: False)
        replay(svc)
        monkeypatch.undo()
        ends = sorted((o.ttft_s or 0.0, o.end_s) for o in svc.outcomes.items)
        return [t for pair in ends for t in pair]

    fast, slow = outcomes(True), outcomes(False)
    assert fast == pytest.approx(slow)
