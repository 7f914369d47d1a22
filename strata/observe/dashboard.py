"""The Strata Grafana dashboard, generated with Grafana's grafana-foundation-sdk.

``strata crds generate`` writes ``charts/strata/files/grafana-dashboard.json``; the chart ships
it in a ConfigMap labelled for Grafana's dashboard sidecar. Queries read the recording rules of
``strata.observe.rules`` (one definition of each number) and the operator's own series; every
one is checked to parse as PromQL (tests/observe/test_dashboard.py) and, end to end, to return
data from the test Prometheus."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

from grafana_foundation_sdk.builders import dashboard as gd
from grafana_foundation_sdk.builders import prometheus as gp
from grafana_foundation_sdk.builders import table, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as dm

from strata.observe import rules

DASHBOARD_FILE = "charts/strata/files/grafana-dashboard.json"
UID = "strata-overview"
DATASOURCE = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
# Every query filters on the dashboard's variables.
SERVICE_FILTER = '{namespace=~"$namespace", service_tier=~"$service_tier", service=~"$service"}'
TIER_FILTER = '{service_tier=~"$service_tier"}'
SCALING_DECISIONS = "strata_autoscaler_scaling_decisions_total"
GPU_SECONDS = "strata_cost_gpu_seconds_total" + SERVICE_FILTER
CACHE_GIB_HOURS = "strata_cost_cache_gib_hours_total" + SERVICE_FILTER


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str
    instant: bool = False

    def target(self, ref: str) -> gp.Dataquery:
        q = gp.Dataquery().expr(self.expr).legend_format(self.legend).ref_id(ref).datasource(DATASOURCE)
        return q.instant() if self.instant else q.range()


@dataclass(frozen=True)
class Chart:
    title: str
    description: str
    unit: str
    queries: tuple[Query, ...]
    kind: str = "timeseries"  # or "table" (instant queries)


def per_service(record: str) -> str:
    return record + SERVICE_FILTER


def slo_charts() -> list[Chart]:
    return [
        Chart(
            "TTFT p95 against the tier's target",
            "Time to first token, 95th percentile over 5 minutes, per service, and its tier's slo.ttftP95Ms.",
            "s",
            (
                Query(per_service(rules.TTFT_P95), "{{namespace}}/{{service}} p95"),
                Query(per_service(rules.TTFT_TARGET), "{{namespace}}/{{service}} target"),
            ),
        ),
        Chart(
            "SLO attainment per tier",
            "Share of requests whose first token came within the tier's target (the SLO is 95 %).",
            "percentunit",
            (Query(rules.attainment("1h", per_tier=True) + TIER_FILTER, "{{service_tier}} (1h)"),),
        ),
        Chart(
            "Error-budget burn rate per tier",
            "1 = spending the 5 % budget exactly; the fast-burn alert pages above 14.4 (1 h and 5 min).",
            "none",
            (
                Query(rules.burn_rate("1h") + TIER_FILTER, "{{service_tier}} 1h"),
                Query(rules.burn_rate("5m") + TIER_FILTER, "{{service_tier}} 5m"),
            ),
        ),
    ]


def capacity_charts() -> list[Chart]:
    by_service = "max by (namespace, service) "
    return [
        Chart(
            "KV-cache usage",
            "Mean share of HBM KV blocks in use across each service's replicas.",
            "percentunit",
            (Query(per_service(rules.KV_USAGE), "{{namespace}}/{{service}}"),),
        ),
        Chart(
            "Replicas: desired and ready",
            "From the operator; scaling decisions are the dashboard's annotations.",
            "none",
            (
                Query(
                    by_service + f"(strata_service_desired_replicas{SERVICE_FILTER})",
                    "{{namespace}}/{{service}} desired",
                ),
                Query(
                    by_service + f"(strata_service_ready_replicas{SERVICE_FILTER})",
                    "{{namespace}}/{{service}} ready",
                ),
            ),
        ),
    ]


def cache_charts() -> list[Chart]:
    return [
        Chart(
            "Prefix hit ratio per cache tier",
            "Share of prompt tokens served from each tier instead of recomputed.",
            "percentunit",
            (Query(per_service(rules.HIT_RATIO), "{{namespace}}/{{service}} {{tier}}"),),
        ),
        Chart(
            "Admission per cache tier",
            "Share of the blocks offered to DRAM and NVMe that the tier's admission policy let in, and "
            "whether it admits only blocks seen before (1: doorkeeper, or adaptive following it).",
            "percentunit",
            (
                Query(per_service(rules.KVTIER_ADMITTED), "{{namespace}}/{{service}} {{tier}} admitted"),
                Query(
                    f"max by (namespace, service, tier) (strata_kvtier_admission_doorkeeper{SERVICE_FILTER})",
                    "{{namespace}}/{{service}} {{tier}} doorkeeper",
                ),
            ),
        ),
        Chart(
            "Tier bandwidth",
            "Bytes read from and written to each KV-cache tier, and of NVMe's the part the engines "
            "moved themselves (direct_io: no copy through the sidecar's slots; 0 where a ServiceTier's "
            "tiers do not allow it, docs/kvtier.md).",
            "Bps",
            (
                Query(per_service(rules.READ_BYTES), "{{namespace}}/{{service}} {{tier}} read"),
                Query(per_service(rules.WRITTEN_BYTES), "{{namespace}}/{{service}} {{tier}} write"),
                Query(
                    "sum by (namespace, service, tier) "
                    f"(rate(strata_kvtier_direct_read_bytes_total{SERVICE_FILTER}[5m]))",
                    "{{namespace}}/{{service}} {{tier}} read by the engine",
                ),
                Query(
                    "sum by (namespace, service, tier) "
                    f"(rate(strata_kvtier_direct_written_bytes_total{SERVICE_FILTER}[5m]))",
                    "{{namespace}}/{{service}} {{tier}} written by the engine",
                ),
            ),
        ),
    ]


def lookahead_charts() -> list[Chart]:
    """What the sidecars know of the requests to come, and what moving their blocks up gave."""
    return [
        Chart(
            "Look-ahead",
            "Queued requests whose blocks the sidecars keep and move up to DRAM before they are "
            "scheduled, from the engines' own queues and from the routers' (docs/kvtier.md); and "
            "those not announced, past the look-ahead's bound on blocks, per second.",
            "none",
            (
                Query(
                    f"sum by (namespace, service, source) (strata_kvtier_lookahead_requests{SERVICE_FILTER})",
                    "{{namespace}}/{{service}} {{source}}",
                ),
                Query(
                    "sum by (namespace, service, source) "
                    f"(rate(strata_kvtier_lookahead_refused_total{SERVICE_FILTER}[5m]))",
                    "{{namespace}}/{{service}} {{source}} refused/s",
                ),
            ),
        ),
        Chart(
            "Prefetch",
            "Blocks moved up to DRAM ahead of the requests that need them (the look-ahead and the "
            "engine's hints), by the tier they came from, those a request then asked for, and those a "
            "request found still being read up and waited for (a prefetch started late), per second.",
            "none",
            (
                Query(
                    "sum by (namespace, service, tier) "
                    f"(rate(strata_kvtier_prefetched_total{SERVICE_FILTER}[5m]))",
                    "{{namespace}}/{{service}} from {{tier}}",
                ),
                Query(
                    "sum by (namespace, service, tier) "
                    f"(rate(strata_kvtier_prefetch_used_total{SERVICE_FILTER}[5m]))",
                    "{{namespace}}/{{service}} from {{tier}}, used",
                ),
                Query(
                    "sum by (namespace, service, tier) "
                    f"(rate(strata_kvtier_read_waits_total{SERVICE_FILTER}[5m]))",
                    "{{namespace}}/{{service}} from {{tier}}, waited for",
                ),
            ),
        ),
    ]


def bottleneck_charts() -> list[Chart]:
    return [
        Chart(
            "Bottleneck verdict",
            "The operator's verdict per service (docs/operator.md, 'Bottleneck diagnosis').",
            "none",
            (
                Query(
                    f"max by (namespace, service, verdict) (strata_service_bottleneck{SERVICE_FILTER}) == 1",
                    "",
                    True,
                ),
            ),
            kind="table",
        ),
        Chart(
            "Engine busy and tier wait",
            "Busy: share of wall time in engine steps; tier wait: share of step time waiting on tier loads "
            "and saves.",
            "percentunit",
            (
                Query(per_service(rules.ENGINE_BUSY), "{{namespace}}/{{service}} busy"),
                Query(per_service(rules.TIER_WAIT), "{{namespace}}/{{service}} tier wait"),
            ),
        ),
    ]


def cost_charts() -> list[Chart]:
    return [
        Chart(
            "GPUs in use per tenant and tier",
            "GPU-seconds per second: replicas x GPUs per replica.",
            "none",
            (
                Query(
                    f"sum by (namespace, service_tier) (rate({GPU_SECONDS}[5m]))",
                    "{{namespace}} {{service_tier}}",
                ),
            ),
        ),
        Chart(
            "Cost over the dashboard's range",
            "GPU-hours and cache GiB-hours per tenant, service tier and cache tier.",
            "none",
            (
                Query(
                    f"sum by (namespace, service_tier) (increase({GPU_SECONDS}[$__range])) / 3600",
                    "GPU-hours",
                    True,
                ),
                Query(
                    f"sum by (namespace, service_tier, tier) (increase({CACHE_GIB_HOURS}[$__range]))",
                    "GiB-hours",
                    True,
                ),
            ),
            kind="table",
        ),
    ]


def rows() -> list[tuple[str, list[Chart]]]:
    return [
        ("Latency SLO", slo_charts()),
        ("Capacity and scaling", capacity_charts()),
        ("KV cache tiers", cache_charts()),
        ("Look-ahead and prefetch", lookahead_charts()),
        ("Bottleneck", bottleneck_charts()),
        ("Cost per tenant and tier", cost_charts()),
    ]


def panel(chart: Chart) -> timeseries.Panel | table.Panel:
    built = timeseries.Panel() if chart.kind == "timeseries" else table.Panel()
    built = built.title(chart.title).description(chart.description).unit(chart.unit).datasource(DATASOURCE)
    for i, query in enumerate(chart.queries):
        built = built.with_target(query.target(chr(ord("A") + i)))
    return built.height(8).span(12)


def variable(name: str, label: str, metric: str) -> gd.QueryVariable:
    return (
        gd.QueryVariable(name)
        .label(label)
        .datasource(DATASOURCE)
        .query(f"label_values({metric}, {name})")
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
    )


def scaling_annotation() -> gd.AnnotationQuery:
    expr = f"sum by (namespace, service) (increase({SCALING_DECISIONS}{SERVICE_FILTER}[1m])) > 0"
    return (
        gd.AnnotationQuery()
        .name("Scaling decisions")
        .datasource(DATASOURCE)
        .enable(True)
        .icon_color("orange")
        .expr(expr)
    )


def build() -> gd.Dashboard:
    board = (
        gd.Dashboard("Strata")
        .uid(UID)
        .description("LLM inference on Strata: latency SLO, KV cache, scaling, bottlenecks and cost.")
        .tags(["strata", "llm-inference"])
        .refresh("30s")
        .time("now-3h", "now")
        .with_variable(gd.DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
        .with_variable(variable("namespace", "Namespace", rules.KV_USAGE))
        .with_variable(variable("service_tier", "Service tier", rules.KV_USAGE))
        .with_variable(variable("service", "Service", rules.KV_USAGE))
        .annotation(scaling_annotation())
    )
    for title, charts in rows():
        board = board.with_row(gd.Row(title))
        for chart in charts:
            board = board.with_panel(panel(chart))
    return board


def dashboard_json() -> str:
    return json.dumps(build().build(), cls=JSONEncoder, sort_keys=True, indent=2) + "\n"


def queries() -> Iterator[str]:
    """Every PromQL expression the dashboard runs: panels, variables and annotations."""
    for _, charts in rows():
        for chart in charts:
            yield from (q.expr for q in chart.queries)
    yield scaling_annotation().build().expr or ""
