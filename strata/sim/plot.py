"""The PNG of a comparison: per service, replicas over time and TTFT p95 per minute, one line per
policy. matplotlib is the optional ``sim`` extra: only this module needs it, imported when a
plot is drawn."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

Series = Mapping[str, Mapping[str, Sequence[float | None]]]  # service -> report.series(...)


def draw(runs: Mapping[str, Series], targets_s: Mapping[str, float], title: str, out: str | Path) -> Path:
    """``runs``: policy -> service -> series. Writes ``out`` and returns its path."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only, no display
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise RuntimeError("plot: matplotlib is not installed (pip install 'strata[sim]')") from err
    services = sorted({name for series in runs.values() for name in series})
    figure, axes = plt.subplots(2, len(services), figsize=(6.5 * len(services), 7), squeeze=False)
    for column, service in enumerate(services):
        _replicas(axes[0][column], runs, service)
        _ttft(axes[1][column], runs, service, targets_s.get(service))
    figure.suptitle(title)
    figure.tight_layout()
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=80)  # readable, and small enough to keep in git
    plt.close(figure)
    return path


def _replicas(ax: Any, runs: Mapping[str, Series], service: str) -> None:
    for policy, series in runs.items():
        if service in series:
            minutes = [(t or 0.0) / 60 for t in series[service]["time_s"]]
            ax.step(minutes, series[service]["replicas"], where="post", label=policy, linewidth=1.2)
    ax.set_title(f"{service}: replicas holding GPUs")
    ax.set_xlabel("minutes")
    ax.set_ylabel("replicas")
    ax.legend(fontsize=8)


def _ttft(ax: Any, runs: Mapping[str, Series], service: str, target: float | None) -> None:
    for policy, series in runs.items():
        if service in series:
            minutes = [(t or 0.0) / 60 for t in series[service]["window_s"]]
            values = [v if v is not None else float("nan") for v in series[service]["ttft_p95_s"]]
            ax.plot(minutes, values, label=policy, linewidth=1.2)
    if target is not None:
        ax.axhline(target, color="black", linestyle="--", linewidth=0.8, label="tier target")
    ax.set_yscale("log")
    ax.set_title(f"{service}: TTFT p95 per minute (s)")
    ax.set_xlabel("minutes")
    ax.set_ylabel("seconds")
    ax.legend(fontsize=8)
