"""docs/tiers.md defends the default tiers' values; its summary table must be the shipped values."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
TIERS = ("premium", "standard", "batch")


def table() -> dict[str, list[str]]:
    """Row label -> the premium, standard and batch cells of the summary table."""
    rows: dict[str, list[str]] = {}
    for line in (ROOT / "docs" / "tiers.md").read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) == 4:
            rows[cells[0].split("`")[1]] = cells[1:]
    return rows


def spec(tier: str) -> dict[str, Any]:
    manifest: dict[str, Any] = yaml.safe_load(
        (ROOT / "examples" / "servicetiers" / f"{tier}.yaml").read_text()
    )
    return manifest["spec"]  # type: ignore[no-any-return]


def at(data: dict[str, Any], dotted: str) -> Any:
    for key in dotted.split("."):
        data = data[key]
    return data


@pytest.mark.parametrize(
    "field",
    [
        "priority",
        "slo.ttftP95Ms",
        "slo.interTokenLatencyP95Ms",
        "cache.hbm.kvFraction",
        "cache.writeMode",
        "autoscaling.targetKvCacheUsage",
        "autoscaling.targetPrefillUtilization",
    ],
)
def test_the_summary_table_shows_the_shipped_values(field: str) -> None:
    row = table()[field]
    assert row == [
        f"{at(spec(t), field):,}" if isinstance(at(spec(t), field), int) else str(at(spec(t), field))
        for t in TIERS
    ]


def test_the_size_rows_match() -> None:
    rows = table()
    for tier, dram, nvme in zip(TIERS, rows["cache.dram"], rows["cache.nvme"], strict=True):
        cache = spec(tier)["cache"]
        assert dram == f"{cache['dram']['defaultSize']} / {cache['dram']['maxSize']}"
        assert nvme == f"{cache['nvme']['defaultSize']} / {cache['nvme']['maxSize']}"
