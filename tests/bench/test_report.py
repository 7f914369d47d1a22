"""docs/benchmarks.md and README's performance table are what bench/results gives (`make docs`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bench import report

ROOT = Path(__file__).resolve().parents[2]


def test_the_committed_tables_are_current() -> None:
    diffs = report.stale(ROOT)
    assert not diffs, "stale; run `make docs`:\n" + "\n".join(diffs)


def test_every_figure_reads_a_committed_result() -> None:
    for name in {f.bench for f in report.FIGURES}:
        assert (ROOT / report.RESULTS / f"{name}.json").is_file(), name


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    for path in (
        report.PAGE,
        report.README,
        *(report.RESULTS / f"{n}.json" for n in {f.bench for f in report.FIGURES} | {report.CHAOS}),
    ):
        if not (ROOT / path).is_file():  # the chaos benchmark's, where it has not run
            continue
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / path, tmp_path / path)
    return tmp_path


def test_a_changed_result_makes_both_stale(copy: Path) -> None:
    figure = report.FIGURES[0]
    path = copy / report.RESULTS / f"{figure.bench}.json"
    result = json.loads(path.read_text())
    target = result
    *parents, last = figure.ours.split("/")[1:]
    for key in parents:
        target = target[key]
    target[last] = target[last] * 2 + 1
    path.write_text(json.dumps(result))
    stale = report.stale(copy)
    assert len(stale) == 2
    assert all(str(report.PAGE) in d or str(report.README) in d for d in stale)


def test_a_result_without_a_date_is_refused(copy: Path) -> None:
    path = copy / report.RESULTS / "worker.json"
    result = json.loads(path.read_text())
    del result["date"]
    path.write_text(json.dumps(result))
    with pytest.raises(ValueError, match="no date"):
        report.rendered(copy)


@pytest.mark.parametrize(
    ("number", "unit", "text"),
    [
        (0.1744, "s", "174 ms"),
        (17.9065, "s", "17.9 s"),
        (4.7, "ms", "4.7 ms"),
        (6.881, "GB/s", "6.88 GB/s"),
        (0.1734, "ratio", "0.173"),
        (9216, "tokens", "9,216"),
        (650, "bytes", "650 B"),
    ],
)
def test_values_are_shown_in_their_unit(number: float, unit: str, text: str) -> None:
    assert report.value(number, unit) == text


def test_the_chaos_rows_are_a_table_of_their_own_when_the_benchmark_ran() -> None:
    assert report.chaos_lines(None) == []
    row = {"fault": "etcd", "recovery_s": None} | {c: 0 for c in report.CHAOS_COLUMNS} | {"sent": 9}
    lines = report.chaos_lines({"rows": [row], "summary": "1 fault"})
    assert lines[0] == "## Faults under load"
    assert "| `etcd` | 9 | 0 | 0 | 0 | 0 | 0 | 0 | not back |" in lines and "1 fault." in lines


def test_the_ratio_is_how_many_times_better_ours_is() -> None:
    lower = report.Row(report.FIGURES[0], ours=0.5, baseline=5.0, machine="m", date="d")
    higher = report.Row(report.FIGURES[3], ours=3.0, baseline=2.0, machine="m", date="d")
    assert lower.figure.lower_is_better and lower.ratio == 10.0
    assert not higher.figure.lower_is_better and higher.ratio == 1.5
