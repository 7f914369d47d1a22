"""The JSON files of a model directory (config.json, generation_config.json, ...), each of which
must hold one object. Torch-free: the router reads generation_config.json too."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from strata.worker.models.errors import ModelLoadError


def read_object(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ModelLoadError(f"model.path: {path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ModelLoadError(f"model.path: {path} must hold a JSON object")
    return data


def read_optional(path: Path) -> dict[str, Any]:
    """``{}`` where the file is absent."""
    return read_object(path) if path.is_file() else {}
