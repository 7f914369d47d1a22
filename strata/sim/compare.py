"""Policies side by side on one scenario: size the static baselines if asked for, run each
policy, and gather what the table, the JSON and the plot show."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from strata.sim import report
from strata.sim.policies.catalog import STATIC, Knobs, factory
from strata.sim.run import Scenario, simulate
from strata.sim.sizing import static_sizes


@dataclass
class Comparison:
    summaries: list[dict[str, Any]]
    series: dict[str, dict[str, dict[str, list[float | None]]]]  # policy -> service -> series
    targets_s: dict[str, float]  # service -> TTFT target
    static: Mapping[str, Mapping[str, int]]

    def to_json(self) -> dict[str, Any]:
        return {"runs": self.summaries, "static_sizes": self.static, "ttft_targets_s": self.targets_s}


def compare(
    scenario: Scenario,
    policies: Sequence[str],
    knobs: Knobs | None = None,
    log: Any = None,
) -> Comparison:
    knobs = knobs or Knobs()
    static = dict(knobs.static)
    if any(p in STATIC and p not in static for p in policies):
        static = {**static_sizes(scenario), **static}
        knobs = Knobs(static, knobs.kpa_target, knobs.kpa_default_target)
    summaries, series = [], {}
    targets: dict[str, float] = {}
    for policy in policies:
        result = simulate(scenario, policy, factory(policy, knobs))
        summaries.append(report.summary(result))
        series[policy] = {s.name: report.series(s) for s in result.services}
        targets = {s.name: s.ttft_target_s for s in result.services}
        if log is not None:
            took = f"{result.wall_s:.1f} s ({result.cpu_s:.1f} s of CPU)"
            log(f"{policy}: {result.end_s:.0f} s simulated in {took}")
    return Comparison(summaries, series, targets, static)


def plot(comparison: Comparison, title: str, out: str | Path) -> Path:
    from strata.sim.plot import draw  # matplotlib only when a plot is asked for

    return draw(comparison.series, comparison.targets_s, title, out)
