"""What makes a request impossible to serve, and the ``max_tokens`` a request that sets none gets,
decided the same way wherever it is checked.

The worker's engine checks these before queueing a request; the router checks them before
forwarding one, so a caller gets the worker's exact error without a worker being touched.
Torch-free: the router imports it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions; chat fills the context


class RequestError(ValueError):
    """A request the engine cannot take; ``field`` names the offending request field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def max_tokens(
    kind: Literal["completion", "chat"], asked: int | None, generation_max: int | None, room: int
) -> int:
    """The request's ``max_tokens``, else the model's generation_config.json's, else OpenAI's
    default; ``room``: the context left after the prompt."""
    if asked:
        return asked
    default = COMPLETION_MAX_TOKENS if kind == "completion" else room
    return min(default, generation_max or room, max(room, 1))


def check(token_ids: Sequence[int], max_tokens: int, max_context: int, vocab_size: int | None) -> None:
    """Raise :class:`RequestError` for a prompt no replica could serve (``vocab_size`` None: ids
    not checked here)."""
    if not token_ids:
        raise RequestError("prompt", "must not be empty")
    if max_tokens < 1:
        raise RequestError("max_tokens", "must be at least 1")
    if len(token_ids) + max_tokens > max_context:
        field = "prompt" if len(token_ids) >= max_context else "max_tokens"
        raise RequestError(
            field,
            f"prompt ({len(token_ids)} tokens) plus max_tokens ({max_tokens}) exceeds the "
            f"context of {max_context} tokens",
        )
    if vocab_size is not None and (min(token_ids) < 0 or max(token_ids) >= vocab_size):
        raise RequestError("prompt", f"token ids must be in [0, {vocab_size})")
