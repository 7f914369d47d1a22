"""Trace slices become requests whose prompts share token blocks exactly where the trace's
hash_ids do; summaries count errors against the SLO."""

from __future__ import annotations

from pathlib import Path

import pytest

from strata.common.traces import cloned_from, traces_dir
from strata.loadgen.summary import Outcome, percentile, summarize
from strata.loadgen.trace import (
    Scaling,
    TraceError,
    TraceRecord,
    block_tokens,
    read_trace,
    shared_prefix_tokens,
    timed_requests,
)

CONVERSATION = traces_dir() / "mooncake_conversation.jsonl"


def record(ts: int, hashes: tuple[int, ...], length: int | None = None, out: int = 64) -> TraceRecord:
    return TraceRecord(
        timestamp=ts, input_length=length or 512 * len(hashes), output_length=out, hash_ids=hashes
    )


def test_equal_hash_ids_give_equal_token_blocks_and_so_a_shared_prefix() -> None:
    scaling = Scaling(block_tokens=16, time_compression=10, output_scale=1 / 8)
    first, second, third = timed_requests(
        [record(1000, (0, 1, 2)), record(3000, (0, 1, 7)), record(3000, (5, 1, 2))], scaling
    )
    assert (first.at_s, second.at_s) == (0.0, 0.2)
    assert len(first.prompt) == 48 and first.max_tokens == 8
    assert first.prompt[:32] == second.prompt[:32] and first.prompt[32:] != second.prompt[32:]
    assert first.prompt[:16] != third.prompt[:16]  # another first block: nothing shared
    assert first.prompt[16:32] == third.prompt[16:32]  # equal block, but after another prefix
    assert block_tokens(1, 16) == first.prompt[16:32]
    assert all(32 <= t <= 126 for t in first.prompt)
    assert shared_prefix_tokens([first, second, third], 16) == 32


def test_lengths_are_scaled_and_capped() -> None:
    scaling = Scaling(block_tokens=16, max_prompt_tokens=40, max_output_tokens=5, output_scale=1 / 32)
    (long,) = timed_requests([record(0, tuple(range(20)), out=10_000)], scaling)
    assert len(long.prompt) == 40 and long.blocks == (0, 1, 2) and long.max_tokens == 5
    (short,) = timed_requests([record(0, (9,), length=100, out=0)], scaling)
    assert len(short.prompt) == 4 and short.max_tokens == 1  # ceil(100 * 16 / 512); at least one token out


def test_bad_scaling_and_bad_lines_are_refused_with_the_field(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="time_compression"):
        Scaling(time_compression=0)
    bad = tmp_path / "t.jsonl"
    bad.write_text(
        '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1]}\n{"timestamp": -1}\n'
    )
    with pytest.raises(TraceError, match=r"t\.jsonl:2: timestamp: "):
        read_trace(bad)
    bad.write_text("not json\n")
    with pytest.raises(TraceError, match=r"t\.jsonl:1: not JSON"):
        read_trace(bad)


@pytest.mark.skipif(not CONVERSATION.exists(), reason=f"{CONVERSATION} not present (set STRATA_TRACES_DIR)")
def test_the_shared_conversation_trace_reads_in_slices() -> None:
    first = read_trace(CONVERSATION, start=0, count=3)
    assert [r.hash_ids[0] for r in first] == [0, 0, 0]
    later = read_trace(CONVERSATION, start=100, count=2)
    assert later[0].timestamp == 36000 and len(later) == 2
    requests = timed_requests(read_trace(CONVERSATION, count=300), Scaling(block_tokens=16))
    assert shared_prefix_tokens(requests, 16) > 0  # the slice reuses prefixes, as the trace does


def test_summary_counts_errors_against_the_slo() -> None:
    outcomes = [
        Outcome(0.0, 100, ttft_s=0.1, e2e_s=0.5, cached_tokens=50),
        Outcome(0.1, 100, ttft_s=0.4, e2e_s=0.9, cached_tokens=0),
        Outcome(0.2, 100, error="HTTP 503: draining"),
    ]
    summary = summarize(outcomes, ttft_target_s=0.3)
    assert (summary.requests, summary.errors) == (3, 1)
    assert summary.slo_attainment == pytest.approx(1 / 3)
    assert summary.cached_ratio == 0.25 and summary.ttft_p95_s == 0.4 and summary.ttft_p50_s == 0.1
    assert percentile([], 0.5) is None and summarize([], 1.0).slo_attainment is None


def test_a_clone_finds_the_traces_beside_the_checkout_it_was_cloned_from(tmp_path: Path) -> None:
    origin, clone = tmp_path / "work" / "main", tmp_path / "elsewhere" / "clone"
    (clone / ".git").mkdir(parents=True)
    origin.mkdir(parents=True)
    (clone / ".git" / "config").write_text(f'[core]\n\tbare = false\n[remote "origin"]\n\turl = {origin}\n')
    assert cloned_from(clone) == [origin]


def test_a_remote_on_another_machine_is_not_a_place_to_look(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    for url in ("https://example.com/strata.git", "git@example.com:strata.git", "relative/path"):
        (tmp_path / ".git" / "config").write_text(f'[remote "origin"]\n\turl = {url}\n')
        assert cloned_from(tmp_path) == []
    assert cloned_from(tmp_path / "no-checkout") == []


def test_the_traces_directory_named_in_the_environment_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STRATA_TRACES_DIR", str(tmp_path))
    assert traces_dir() == tmp_path
