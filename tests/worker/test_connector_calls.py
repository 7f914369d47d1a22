"""Only the engine's step (kv_tiers) calls the KV-tier connector: the scheduler decides, the step
does the tier I/O. Which modules may import which is pyproject.toml's import-linter contracts'."""

from __future__ import annotations

from pathlib import Path

ENGINE = Path(__file__).resolve().parents[2] / "worker" / "engine"


def test_only_kv_tiers_calls_the_connector() -> None:
    for path in ENGINE.glob("*.py"):
        text = path.read_text()
        if path.name != "kv_tiers.py":
            assert ".connector." not in text and "connector.save" not in text, path.name
