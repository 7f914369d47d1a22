"""Strata's Prometheus recording rules and alerts, defined once.

``strata crds generate`` writes them to ``charts/strata/files/prometheus-rules.yaml``: the plain
rules file that the test Prometheus loads and ``promtool`` checks and unit-tests, and the very
text the chart's PrometheusRule embeds. Naming follows Prometheus' ``level:metric:operations``:
``strata:`` is per InferenceService, ``strata_tier:`` per ServiceTier.

SLO: a tier's ``slo.ttftP95Ms`` says 95 % of requests get their first token within it, so the
error budget is 5 % of requests. Attainment counts requests exactly (the worker counts those
within its tier's target), and the burn-rate alerts are the multiwindow pairs of the Google SRE
workbook: 14.4x over 1 h and 5 min pages, 6x over 6 h and 30 min warns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from strata.observe.labels import BY_SERVICE, BY_TIER, CACHE_TIER, NAMESPACE, POD, by

W = "strata_worker_"
K = "strata_kvtier_"
SLO_TARGET = 0.95
ERROR_BUDGET = round(1 - SLO_TARGET, 10)
RATE_WINDOW = "5m"
SLO_WINDOWS = ("5m", "30m", "1h", "6h")
FAST_BURN, SLOW_BURN = 14.4, 6.0
KV_SATURATED = 0.95
RULES_FILE = "charts/strata/files/prometheus-rules.yaml"

SERVICE_KEY = by(*BY_SERVICE)
TIER_KEY = by(*BY_TIER)


@dataclass(frozen=True)
class Record:
    record: str
    expr: str

    def manifest(self) -> dict[str, Any]:
        return {"record": self.record, "expr": self.expr}


@dataclass(frozen=True)
class Alert:
    alert: str
    expr: str
    for_: str
    severity: str
    summary: str
    description: str

    def manifest(self) -> dict[str, Any]:
        return {
            "alert": self.alert,
            "expr": self.expr,
            "for": self.for_,
            "labels": {"severity": self.severity},
            "annotations": {"summary": self.summary, "description": self.description},
        }


def rate(metric: str, window: str = RATE_WINDOW) -> str:
    return f"rate({metric}[{window}])"


def ratio_of_sums(numerator: str, denominator: str, key: str) -> str:
    return f"sum {key} ({numerator})\n/\nsum {key} ({denominator})"


def share_of_two(part: str, other: str, key: str) -> str:
    """``part`` over ``part`` + ``other`` (two counters that split one count)."""
    return f"sum {key} ({part})\n/\n(sum {key} ({part}) + sum {key} ({other}))"


# ------------------------------------------------------------------------ latency and the SLO

TTFT_P95 = "strata:ttft_seconds:p95_rate5m"
TTFT_P95_TIER = "strata_tier:ttft_seconds:p95_rate5m"
TTFT_TARGET = "strata:ttft_slo_seconds:max"


def attainment(window: str, per_tier: bool = False) -> str:
    return f"strata{'_tier' if per_tier else ''}:ttft_slo_attainment:ratio_rate{window}"


def burn_rate(window: str) -> str:
    return f"strata_tier:ttft_slo_burn_rate:rate{window}"


def latency_records() -> list[Record]:
    bucket = rate(W + "time_to_first_token_seconds_bucket")
    records = [
        Record(TTFT_P95, f"histogram_quantile(0.95, sum {by(*BY_SERVICE, 'le')} ({bucket}))"),
        Record(TTFT_P95_TIER, f"histogram_quantile(0.95, sum {by(*BY_TIER, 'le')} ({bucket}))"),
        Record(TTFT_TARGET, f"max {SERVICE_KEY} ({W}ttft_slo_seconds)"),
    ]
    for window in SLO_WINDOWS:
        good, total = (
            rate(W + "ttft_within_slo_total", window),
            rate(W + "time_to_first_token_seconds_count", window),
        )
        records.append(Record(attainment(window), ratio_of_sums(good, total, SERVICE_KEY)))
        records.append(Record(attainment(window, per_tier=True), ratio_of_sums(good, total, TIER_KEY)))
        # x 20 rather than / 0.05: the same number, and exact in floating point.
        records.append(
            Record(burn_rate(window), f"(1 - {attainment(window, per_tier=True)}) * {1 / ERROR_BUDGET:g}")
        )
    return records


# ------------------------------------------------------------------------ KV cache and tiers

KV_USAGE = "strata:kv_cache_usage:avg"
HIT_RATIO = "strata:prefix_hit_ratio:rate5m"
HIT_RATIO_TIER = "strata_tier:prefix_hit_ratio:rate5m"
KVTIER_HIT_RATIO = "strata:kvtier_hit_ratio:rate5m"
KVTIER_ADMITTED = "strata:kvtier_admitted:ratio_rate5m"
READ_BYTES = "strata:kvtier_read_bytes:rate5m"
WRITTEN_BYTES = "strata:kvtier_written_bytes:rate5m"
# Divide a series per cache tier by one total without the tier label.
PER_CACHE_TIER = f"/ ignoring ({CACHE_TIER}) group_left"


def cache_records() -> list[Record]:
    hits, prompt = rate(W + "prefix_hit_tokens_total"), rate(W + "prompt_tokens_total")
    per_cache_tier = by(*BY_SERVICE, CACHE_TIER)
    sidecar_hits, sidecar_misses = rate(K + "hits_total"), rate(K + "misses_total")
    admitted, refused = rate(K + "admitted_total"), rate(K + "refused_total")
    return [
        Record(KV_USAGE, f"avg {SERVICE_KEY} ({W}kv_cache_usage_ratio)"),
        Record(
            HIT_RATIO,
            f"sum {per_cache_tier} ({hits})\n{PER_CACHE_TIER}\nsum {SERVICE_KEY} ({prompt})",
        ),
        Record(
            HIT_RATIO_TIER,
            f"sum {by(*BY_TIER, CACHE_TIER)} ({hits})\n{PER_CACHE_TIER}\nsum {TIER_KEY} ({prompt})",
        ),
        Record(KVTIER_HIT_RATIO, share_of_two(sidecar_hits, sidecar_misses, per_cache_tier)),
        # What share of the blocks offered to DRAM and NVMe their admission policy let in.
        Record(KVTIER_ADMITTED, share_of_two(admitted, refused, per_cache_tier)),
        Record(READ_BYTES, f"sum {per_cache_tier} ({rate(K + 'read_bytes_total')})"),
        Record(WRITTEN_BYTES, f"sum {per_cache_tier} ({rate(K + 'written_bytes_total')})"),
    ]


# ------------------------------------------------------------------------ where step time goes

ENGINE_BUSY = "strata:engine_busy:ratio_rate5m"
TIER_WAIT = "strata:tier_wait:ratio_rate5m"


def engine_records() -> list[Record]:
    busy = rate(W + "engine_busy_seconds_total")
    return [
        Record(ENGINE_BUSY, f"avg {SERVICE_KEY} ({busy})"),
        Record(TIER_WAIT, ratio_of_sums(rate(W + "tier_wait_seconds_total"), busy, SERVICE_KEY)),
    ]


# ------------------------------------------------------------------------ alerts

SERVICE_TEXT = "{{ $labels.namespace }}/{{ $labels.service }}"


def slo_alerts() -> list[Alert]:
    def burn(name: str, long: str, short: str, factor: float, for_: str, severity: str) -> Alert:
        return Alert(
            name,
            f"{burn_rate(long)} > {factor}\nand\n{burn_rate(short)} > {factor}",
            for_,
            severity,
            "ServiceTier {{ $labels.service_tier }} burns its TTFT error budget " + f"{factor}x too fast",
            f"Over {long} and {short}, more than {factor * ERROR_BUDGET:.0%} of the tier's requests got "
            "their "
            'first token later than the tier\'s slo.ttftP95Ms (burn rate {{ $value | printf "%.1f" }}). '
            "Check the services' bottleneck verdicts (kubectl get infsvc -A -o wide).",
        )

    return [
        burn("StrataTTFTSLOBurnRateFast", "1h", "5m", FAST_BURN, "2m", "critical"),
        burn("StrataTTFTSLOBurnRateSlow", "6h", "30m", SLOW_BURN, "15m", "warning"),
    ]


def health_alerts() -> list[Alert]:
    return [*cache_alerts(), *platform_alerts()]


def cache_alerts() -> list[Alert]:
    return [
        Alert(
            "StrataKVCacheSaturated",
            f"{KV_USAGE} > {KV_SATURATED}",
            "10m",
            "warning",
            f"{SERVICE_TEXT}: HBM KV cache over {KV_SATURATED:.0%} full",
            "Mean KV-cache usage {{ $value | humanizePercentage }} for 10 minutes: requests queue or are "
            "preempted. Raise maxReplicas, or the tier's targetKvCacheUsage headroom.",
        ),
        Alert(
            "StrataKVTierIOErrors",
            f"sum {by(*BY_SERVICE, CACHE_TIER)} (increase({K}io_errors_total[10m])) > 0",
            "0m",
            "warning",
            f"{SERVICE_TEXT}: I/O errors in the {{{{ $labels.tier }}}} cache tier",
            "I/O errors in the last 10 minutes; blocks are recomputed instead of served. "
            "Check the node's disk or the shared volume.",
        ),
        Alert(
            "StrataKVTierFittedToMemory",
            f"min {by(*BY_SERVICE, CACHE_TIER)} ({K}capacity_bytes / {K}configured_bytes) < 1",
            "5m",
            "warning",
            f"{SERVICE_TEXT}: the {{{{ $labels.tier }}}} cache tier holds less than its size",
            "The sidecar indexes {{ $value | humanizePercentage }} of the tier's size: the model's KV "
            "blocks are small (under 1 MiB) and their index outgrew the memory the sidecar has. Give "
            "spec.model.kvBytesPerToken (status.model.kvBytesPerToken shows the workers' figure; the "
            "operator then sizes the sidecar for the model's blocks), "
            "raise spec.engine.blockSize or lower the tier's size (docs/kvtier.md, Memory).",
        ),
        Alert(
            "StrataRouterFollowBudgetSpent",
            f"sum {SERVICE_KEY} (increase(strata_router_unfollowed_blocks_total[15m])) > 0",
            "15m",
            "warning",
            f"{SERVICE_TEXT}: the router no longer follows every cached block",
            "The routers left {{ $value | humanize }} block keys of the replicas' DRAM, NVMe and shared "
            "tiers unfollowed in 15 minutes (past routing.max_followed_blocks: half a router's memory "
            "at 160 bytes a key): requests for those blocks are routed as if nothing held them, and "
            "hit ratios fall. Give the routers more memory (the chart's router.resources, "
            "docs/router.md).",
        ),
    ]


def platform_alerts() -> list[Alert]:
    return [
        Alert(
            "StrataOperatorReconcileErrors",
            f"sum {by(NAMESPACE, POD)} (increase(strata_operator_reconcile_errors_total[15m])) > 0",
            "10m",
            "warning",
            "Strata operator {{ $labels.pod }} keeps failing reconciles",
            "Reconciles failed on API calls for 10 minutes; services may not converge. See the "
            "operator's log and the services' Degraded condition.",
        ),
        Alert(
            "StrataServiceBelowDesiredReplicas",
            f"max {SERVICE_KEY} (strata_service_ready_replicas)\n<\n"
            f"max {SERVICE_KEY} (strata_service_desired_replicas)",
            "15m",
            "warning",
            f"{SERVICE_TEXT} has fewer ready replicas than desired",
            "Ready replicas stayed below the desired count for 15 minutes: pods pending (GPU capacity, "
            "quota) or failing. kubectl describe the service's pods.",
        ),
    ]


def groups() -> list[dict[str, Any]]:
    records = [*latency_records(), *cache_records(), *engine_records()]
    return [
        {"name": "strata.recording", "interval": "30s", "rules": [r.manifest() for r in records]},
        {"name": "strata.alerts", "rules": [a.manifest() for a in (*slo_alerts(), *health_alerts())]},
    ]


class _Dumper(yaml.SafeDumper):
    """Multi-line expressions as YAML block scalars, readable in the file and in kubectl."""


def _str(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|" if "\n" in text else None)


_Dumper.add_representer(str, _str)


def rules_file() -> str:
    header = "# Generated by `strata crds generate` from strata/observe/rules.py. Do not edit.\n"
    return header + yaml.dump({"groups": groups()}, Dumper=_Dumper, sort_keys=False, width=120)


def names() -> list[str]:
    """Every recording rule and alert, for the unit-test coverage check."""
    return [r.get("record") or r["alert"] for g in groups() for r in g["rules"]]
