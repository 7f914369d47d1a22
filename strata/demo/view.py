"""The scaling act's terminal view and its closing table (pure: data in, lines out).

One frame per second while the load runs: per service the replicas desired / ready, the signals
the operator's autoscaler scraped (KV-cache usage, TTFT p95 against the tier's target, prefix hit
ratio per cache tier), what the load generator's clients saw, and every scaling decision with its
reason. At the end, one row per service: peak replicas, requests, TTFT p95, SLO attainment
against its tier's target, and hit ratio per tier over the whole run."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from strata.common.tiers import TIERS
from strata.loadgen.summary import Summary


@dataclass(frozen=True)
class ServiceView:
    name: str
    tier: str
    target_ms: float  # the tier's slo.ttftP95Ms
    desired: int | None = None
    ready: int | None = None
    kv_usage: float | None = None
    ttft_p95_ms: float | None = None  # the autoscaler's last interval
    hit_ratio: Mapping[str, float] = field(default_factory=dict)
    decisions: Sequence[str] = ()  # "12:03:04 TTFT p95 910 ms > target 300 ms: 1 -> 3", oldest first


@dataclass(frozen=True)
class LoadView:
    answered: int = 0  # requests whose response completed
    errors: int = 0
    ttft_p95_s: float | None = None  # the clients' own, over the last few seconds


@dataclass(frozen=True)
class ServiceReport:
    name: str
    tier: str
    target_ms: float
    peak_replicas: int
    load: Summary
    hit_ratio: Mapping[str, float]  # prompt tokens served per tier / prompt tokens, whole run


def frame(elapsed_s: float, service: ServiceView, load: LoadView, decisions_shown: int = 6) -> list[str]:
    lines = [
        f"[{elapsed_s:5.0f} s] {service.name} ({service.tier})  replicas {_n(service.desired)} desired / "
        f"{_n(service.ready)} ready   KV {_ratio(service.kv_usage)}   TTFT p95 "
        f"{_ms(service.ttft_p95_ms)} vs target {service.target_ms:.0f} ms {_verdict(service)}",
        f"         hit ratio {_tiers(service.hit_ratio)}",
        f"         load: {load.answered} answered, {load.errors} errors; clients' TTFT p95 "
        f"{_ms(load.ttft_p95_s * 1000 if load.ttft_p95_s is not None else None)}",
    ]
    shown = list(service.decisions)[-decisions_shown:]
    lines += [f"         scaled: {d}" for d in shown] or ["         scaled: (no decision yet)"]
    return lines


def table(reports: Sequence[ServiceReport]) -> list[str]:
    header = (
        f"{'service':<14}{'tier':<9}{'peak replicas':>14}{'requests':>10}{'errors':>8}{'TTFT p95':>10}"
        f"{'target':>8}{'SLO met':>9}" + "".join(f"{t:>8}" for t in TIERS)
    )
    rows = [header]
    for r in reports:
        rows.append(
            f"{r.name:<14}{r.tier:<9}{r.peak_replicas:>14}{r.load.requests:>10}{r.load.errors:>8}"
            f"{_ms(r.load.ttft_p95_s * 1000 if r.load.ttft_p95_s is not None else None):>10}"
            f"{r.target_ms:>6.0f}ms{_percent(r.load.slo_attainment):>9}"
            + "".join(f"{_ratio(r.hit_ratio.get(t)):>8}" for t in TIERS)
        )
    return rows


def _verdict(service: ServiceView) -> str:
    if service.ttft_p95_ms is None:
        return ""
    return "(over)" if service.ttft_p95_ms > service.target_ms else "(met)"


def _tiers(ratios: Mapping[str, float]) -> str:
    return "  ".join(f"{t} {_ratio(ratios.get(t))}" for t in TIERS)


def _n(value: int | None) -> str:
    return "-" if value is None else str(value)


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} ms"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"
