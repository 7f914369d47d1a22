"""A background loop of the sidecar: runs ``step`` until it reports nothing left to do, then
sleeps until woken (or ``wake_s`` passes). Exceptions are logged, never raised: a background
job must not take the sidecar down."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class Loop:
    def __init__(self, name: str, step: Callable[[], bool], wake_s: float = 1.0) -> None:
        self.name = name
        self.step = step
        self.wake_s = wake_s
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"kvtier-{name}", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=60)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.wake_s)
            self._wake.clear()
            try:
                while not self._stop.is_set() and self.step():
                    pass
            except Exception:
                log.exception("kvtier: background %s failed", self.name)
