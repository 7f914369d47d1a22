"""Reading traces: the Mooncake format, arrival-only CSVs, and clear errors for bad input."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from strata.sim.trace import TraceError, load


def write(path: Path, lines: Sequence[object]) -> Path:
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return path


def test_mooncake_lines_become_requests_from_time_zero(tmp_path):
    path = write(
        tmp_path / "t.jsonl",
        [
            {"timestamp": 5000, "input_length": 600, "output_length": 3, "hash_ids": [0, 1]},
            {"timestamp": 2000, "input_length": 512, "output_length": 9, "hash_ids": [0]},
        ],
    )
    trace = load(path)
    assert [r.arrival_s for r in trace.requests] == [0.0, 3.0]
    assert trace.requests[1].blocks == (0, 1) and trace.block_tokens == 512
    assert trace.window(1.0).requests[0].arrival_s == pytest.approx(2.0)
    assert trace.retimed(0.5, 10).requests[1].arrival_s == pytest.approx(11.5)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", r"t.jsonl:1: not JSON"),
        ({"timestamp": -1, "input_length": 5, "output_length": 1, "hash_ids": [0]}, "timestamp"),
        ({"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": []}, "input_length"),
        ({"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [0]}, "hash_ids: 1 ids"),
        ({"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": ["x"]}, "hash_ids"),
    ],
)
def test_a_bad_line_is_refused_naming_the_line_and_the_field(tmp_path, line, message):
    path = tmp_path / "t.jsonl"
    path.write_text((line if isinstance(line, str) else json.dumps(line)) + "\n")
    with pytest.raises(TraceError, match=message):
        load(path)


def test_an_arrivals_csv_gets_blocks_nobody_shares(tmp_path):
    path = tmp_path / "azure.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,1000,20\n"
        "2023-11-16 18:15:48.1805900,100,5\n"
    )
    trace = load(path)
    assert [r.arrival_s for r in trace.requests] == pytest.approx([0.0, 1.5])
    first, second = trace.requests
    assert len(first.blocks) == 2 and len(second.blocks) == 1
    assert not set(first.blocks) & set(second.blocks)


def test_an_arrivals_csv_without_the_columns_names_them(tmp_path):
    path = tmp_path / "x.csv"
    path.write_text("timestamp,tokens\n1,2\n")
    with pytest.raises(TraceError, match="ContextTokens, input_length"):
        load(path)


def test_spreading_moves_requests_within_their_slot_only(tmp_path):
    lines = [
        {"timestamp": t, "input_length": 10, "output_length": 1, "hash_ids": [i]}
        for i, t in enumerate([0, 0, 0, 3000, 3000])
    ]
    trace = load(write(tmp_path / "t.jsonl", lines)).spread(3.0, seed=1)
    times = [r.arrival_s for r in trace.requests]
    assert times == sorted(times)
    assert all(0 <= t < 3 for t in times[:3]) and all(3 <= t < 6 for t in times[3:])
    assert len(set(times)) == 5


def test_a_missing_file_is_a_trace_error(tmp_path):
    with pytest.raises(TraceError, match="cannot read"):
        load(tmp_path / "nope.jsonl")
