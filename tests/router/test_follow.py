"""Applying a stream's events to an endpoint: its view, and its load from the worker's pings."""

from __future__ import annotations

from strata.router.fleet import Address, Fleet
from strata.router.follow import apply, queued_beyond_a_step
from strata.worker.block_events import Event


def test_only_prompt_tokens_beyond_one_engine_step_count_as_queued_before_a_new_request():
    assert queued_beyond_a_step(500, 2048) == 0  # prefilled in the same step as ours
    assert queued_beyond_a_step(5000, 2048) == 5000 - 2048


def test_pings_carry_the_workers_load_and_block_events_fill_the_view():
    endpoint = Fleet(4, 10).add("w", Address("http://127.0.0.1:1", {"worker": "x"}))
    apply(endpoint, "worker", Event("ping", status={"pending_tokens": 3000, "kv_usage": 0.4}), 2048)
    assert endpoint.pending_tokens == 952 and endpoint.kv_usage == 0.4
    apply(endpoint, "sidecar", Event("ping", status={"pending_tokens": 99}), 2048)  # sidecars carry none
    assert endpoint.pending_tokens == 952
    apply(endpoint, "worker", Event("snapshot", "hbm", (b"a" * 16,)), 2048)
    apply(endpoint, "worker", Event("synced"), 2048)
    assert endpoint.view.synced["worker"] and b"a" * 16 in endpoint.view.held["hbm"]
