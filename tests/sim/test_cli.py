"""``strata sim`` end to end on a small trace, and its refusals of bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from strata.cli import main as strata
from strata.sim.scenario import read


def small_trace(path: Path, requests: int = 40) -> Path:
    lines = [
        {
            "timestamp": 500 * i,
            "input_length": 1024 + 512 * (i % 3),
            "output_length": 16,
            "hash_ids": [0, i, i + 1000, i + 2000][: 2 + i % 3],
        }
        for i in range(requests)
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_a_trace_through_two_policies_prints_the_table_and_writes_json_and_a_plot(tmp_path, capsys):
    trace = small_trace(tmp_path / "t.jsonl")
    out = tmp_path / "out"
    code = strata(
        ["sim", "--trace", str(trace), "--tier", "premium", "--policies", "builtin,kpa", "--out", str(out)]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "builtin" in printed and "kpa" in printed and "premium" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert [r["policy"] for r in summary["runs"]] == ["builtin", "kpa"]
    assert summary["runs"][0]["services"]["service"]["requests"] == 40
    assert (out / "comparison.png").stat().st_size > 10_000


def test_a_scenario_file_with_two_tiers_and_static_sizing(tmp_path, capsys):
    small_trace(tmp_path / "t.jsonl", requests=20)
    scenario = {
        "profile": "gpu",
        "gpus": 4,
        "services": [
            {"name": "chat", "tier": "premium", "trace": "t.jsonl", "max_replicas": 2},
            {"name": "jobs", "tier": "batch", "trace": "t.jsonl", "min_replicas": 0, "offset_s": 5},
        ],
    }
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(scenario))
    assert strata(["sim", "--scenario", str(tmp_path / "s.yaml"), "--policies", "static_peak", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert set(summary["static_sizes"]["static_peak"]) == {"chat", "jobs"}
    assert set(summary["runs"][0]["services"]) == {"chat", "jobs"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policies", "hpa"], "--policies: unknown"),
        (["--tier", "gold"], "tier: unknown tier 'gold'"),
        (["--profile", "tpu"], "profile: 'tpu' is neither"),
    ],
)
def test_bad_input_exits_2_naming_the_field(tmp_path, capsys, args, message):
    trace = small_trace(tmp_path / "t.jsonl", requests=3)
    assert strata(["sim", "--trace", str(trace), *args]) == 2
    assert message in capsys.readouterr().err


def test_a_bad_scenario_names_the_field(tmp_path, capsys):
    (tmp_path / "s.yaml").write_text(yaml.safe_dump({"gpus": 0, "services": []}))
    assert strata(["sim", "--scenario", str(tmp_path / "s.yaml")]) == 2
    assert "gpus" in capsys.readouterr().err


def test_show_profile_prints_an_editable_profile(capsys):
    assert strata(["sim", "--show-profile", "gpu"]) == 0
    profile = yaml.safe_load(capsys.readouterr().out)
    assert profile["name"] == "gpu" and profile["kv_bytes_per_token"] == 131072


def test_the_example_scenario_is_valid():
    spec = read(Path(__file__).resolve().parents[2] / "examples" / "sim" / "premium-batch.yaml")
    assert [s.tier for s in spec.services] == ["premium", "batch"] and spec.gpus == 24
