"""The generated Grafana dashboard: current, well-formed, and every query is valid PromQL."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from strata.observe import dashboard, rules
from strata.observe.prometheus import find_binary

ROOT = Path(__file__).resolve().parents[2]
VARIABLES = {"$namespace": ".*", "$service_tier": ".*", "$service": ".*", "$__range": "1h"}


def concrete(expr: str) -> str:
    """What Grafana sends once it substitutes the dashboard's variables."""
    for name, value in sorted(VARIABLES.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace(name, value)
    return expr


def test_committed_json_is_what_the_code_generates() -> None:
    assert (ROOT / dashboard.DASHBOARD_FILE).read_text() == dashboard.dashboard_json()


def test_every_panel_queries_prometheus_through_the_datasource_variable() -> None:
    board = json.loads(dashboard.dashboard_json())
    panels = [p for p in board["panels"] if p["type"] != "row"]
    assert len(panels) >= 11
    for panel in panels:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["expr"] and target["datasource"]["uid"] == "${datasource}"
    titles = {p["title"] for p in panels}
    assert {
        "Bottleneck verdict",
        "SLO attainment per tier",
        "Tier bandwidth",
        "Replicas: desired and ready",
    } <= titles
    assert board["annotations"]["list"][0]["expr"].startswith("sum by (namespace, service) (increase(")


def test_recorded_series_the_dashboard_reads_are_recording_rules() -> None:
    recorded = set(rules.names())
    for expr in dashboard.queries():
        for name in re.findall(r"\bstrata(?:_tier)?:[a-z0-9_:]+", expr):
            assert name in recorded, f"{name} is not a recording rule (query: {expr})"


@pytest.mark.cluster  # needs promtool from `make prometheus`
def test_every_query_is_valid_promql(tmp_path: Path) -> None:
    def check(exprs: list[str]) -> subprocess.CompletedProcess[str]:
        group = {"name": "dashboard", "rules": [{"record": f"q{i}", "expr": e} for i, e in enumerate(exprs)]}
        path = tmp_path / "queries.yaml"
        path.write_text(yaml.safe_dump({"groups": [group]}))
        return subprocess.run(
            [str(find_binary("promtool")), "check", "rules", str(path)], capture_output=True, text=True
        )

    exprs = [concrete(e) for e in dashboard.queries()]
    done = check(exprs)
    assert done.returncode == 0, done.stdout + done.stderr
    assert check([*exprs, "sum by (namespace (x)"]).returncode != 0  # the check can fail


@pytest.mark.cluster  # needs bin/helm
def test_the_chart_ships_it_in_a_configmap_for_grafanas_sidecar() -> None:
    from strata.cluster.binaries import find_bin_dir

    out = subprocess.run(
        [
            str(find_bin_dir() / "helm"),
            "template",
            "strata",
            str(ROOT / "charts" / "strata"),
            "--kube-version",
            "1.34.4",
            "--show-only",
            "templates/dashboard.yaml",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    (configmap,) = [d for d in yaml.safe_load_all(out) if d]
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(configmap["data"]["strata-overview.json"]) == json.loads(dashboard.dashboard_json())
