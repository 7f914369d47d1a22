"""One bound for every wait in these tests, and one way to wait.

Every wait polls for the event it needs and returns as soon as it happens; the bound only ends a
wait that will never succeed, so it is generous: a loaded or slow machine (CI, or seven engineers
on two cores) may take many times longer than a developer's laptop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from strata.cluster.processes import wait_until

T = TypeVar("T")
WAIT_S = 300.0


def eventually(check: Callable[[], T | None], what: str, timeout_s: float = WAIT_S) -> T:
    """``check``'s first truthy value; TimeoutError naming ``what`` after ``timeout_s``."""
    return wait_until(check, timeout_s, what, interval_s=0.3)
