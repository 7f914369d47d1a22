"""``GET /v1/models``: the one model served, the worker's and the router's answer alike."""

from __future__ import annotations

from typing import Any


def model_list(name: str, max_model_len: int) -> dict[str, Any]:
    card = {"id": name, "object": "model", "owned_by": "strata", "created": 0, "max_model_len": max_model_len}
    return {"object": "list", "data": [card]}
