"""Bounded waiting and loopback ports: every wait ends, with a message saying what it waited for."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """A bounded wait ran out. An AssertionError, so a test reports it as a failure, not an error."""


def wait_for(
    check: Callable[[], T | None], timeout_s: float, what: str = "condition", interval_s: float = 0.5
) -> T:
    """Poll ``check`` until it returns something truthy (returned) or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise WaitTimeout(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(interval_s)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the caller binds it soon after)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
