"""A trace slice replayed at a real worker (`tiny`, one thread) with the official client: every
request completes, TTFTs are the clients' own, and the cached tokens the clients were told add
up to the prefix hits the worker counted itself."""

from __future__ import annotations

import asyncio
import urllib.request
from dataclasses import replace
from pathlib import Path

import openai
import pytest

from strata.common.traces import traces_dir
from strata.loadgen.background import BackgroundLoad
from strata.loadgen.calibrate import compression_for, throughput
from strata.loadgen.replay import replay
from strata.loadgen.summary import Outcome, summarize
from strata.loadgen.trace import Scaling, TimedRequest, read_trace, timed_requests
from strata.stack.wait import wait_for
from tests.worker.worker_proc import running_worker

pytestmark = pytest.mark.slow
CONVERSATION = traces_dir() / "mooncake_conversation.jsonl"


def worker_hit_tokens(base: str) -> float:
    with urllib.request.urlopen(base + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("strata_worker_prefix_hit_tokens_total{")
    )


async def run(base: str, requests: list[TimedRequest]) -> list[Outcome]:
    async with openai.AsyncOpenAI(base_url=base + "/v1", api_key="unused", max_retries=0) as client:
        return await replay(client, "tiny", requests)


@pytest.mark.skipif(not CONVERSATION.exists(), reason=f"{CONVERSATION} not present (set STRATA_TRACES_DIR)")
def test_a_trace_slice_replays_with_real_prefix_reuse(tmp_path: Path, tiny_dir: Path) -> None:
    scaling = Scaling(block_tokens=16, time_compression=20, max_prompt_tokens=256, max_output_tokens=4)
    requests = timed_requests(read_trace(CONVERSATION, count=40), scaling)
    with running_worker(tiny_dir, tmp_path, block_size=16) as worker:
        outcomes = asyncio.run(run(worker.base_url, requests))
        served_from_cache = worker_hit_tokens(worker.base_url)
    summary = summarize(outcomes, ttft_target_s=60.0)
    assert (summary.requests, summary.errors) == (40, 0), [o.error for o in outcomes if o.error]
    assert all(o.ttft_s is not None and o.e2e_s is not None and o.ttft_s <= o.e2e_s for o in outcomes)
    cached = sum(o.cached_tokens for o in outcomes)
    assert cached > 0 and cached == served_from_cache  # the trace's shared prefixes were really hit


@pytest.mark.skipif(not CONVERSATION.exists(), reason=f"{CONVERSATION} not present (set STRATA_TRACES_DIR)")
def test_a_background_load_stops_cleanly_and_throughput_sizes_replays(tmp_path: Path, tiny_dir: Path) -> None:
    """Stopped mid-replay, a load sends nothing more and every request it sent completes; one
    replica's measured throughput gives the compression that replays a slice at a share of it."""
    scaling = Scaling(block_tokens=16, time_compression=1, max_prompt_tokens=64, max_output_tokens=2)
    records = read_trace(CONVERSATION, count=400)
    requests = timed_requests(records, scaling)
    with running_worker(tiny_dir, tmp_path, block_size=16) as worker:
        measured = asyncio.run(_throughput(worker.base_url, requests))
        fast = timed_requests(records, replace(scaling, time_compression=compression_for(requests, 2.0)))
        load = BackgroundLoad(worker.base_url + "/v1", "tiny", fast).start()
        wait_for(lambda: len(load.outcomes()) >= 3, 300, what="three answers")
        outcomes = load.stop()
        assert load.stop() == outcomes  # stopping again changes nothing
    assert measured > 0
    assert 3 <= len(outcomes) < len(fast) and not [o.error for o in outcomes if o.error]
    span = fast[-1].at_s - fast[0].at_s
    assert len(fast) / span == pytest.approx(2.0, rel=0.01)


async def _throughput(base: str, requests: list[TimedRequest]) -> float:
    async with openai.AsyncOpenAI(base_url=base + "/v1", api_key="unused", max_retries=0) as client:
        return await throughput(client, "tiny", requests, concurrency=2, duration_s=2)
