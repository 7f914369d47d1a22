"""Progress of a model fetch in the logs: bytes and files done, rate, at most every few seconds.

Shared by the download threads of one fetch; a kubectl logs on the init container shows that a
40 GB download is moving, and how fast.
"""

from __future__ import annotations

import logging
import threading
import time

log = logging.getLogger("strata.worker.fetch")
LOG_EVERY_S = 5.0


class Progress:
    def __init__(self, source: str) -> None:
        self.source = source
        self._lock = threading.Lock()
        self.bytes_done = 0  # this run's downloads
        self.bytes_skipped = 0  # already on disk from an earlier run (complete files, partial ones)
        self.files_done = 0
        self.files_total = 0
        self._started = self._logged = time.monotonic()

    def expect(self, files: int) -> None:
        with self._lock:
            self.files_total += files

    def kept(self, nbytes: int, whole_file: bool = False) -> None:
        """Bytes already on disk: a partial file continued, or (``whole_file``) a complete one."""
        with self._lock:
            self.bytes_skipped += nbytes
            self.files_done += int(whole_file)

    def add(self, nbytes: int) -> None:
        with self._lock:
            self.bytes_done += nbytes
            now = time.monotonic()
            if now - self._logged < LOG_EVERY_S:
                return
            self._logged = now
        self._log("fetch progress")

    def file_done(self, name: str) -> None:
        with self._lock:
            self.files_done += 1
        log.info("fetched file", extra={"file": name, "source": self.source})

    def finished(self) -> None:
        self._log("fetch finished")

    def _log(self, message: str) -> None:
        elapsed = max(time.monotonic() - self._started, 1e-9)
        log.info(
            message,
            extra={
                "source": self.source,
                "files_done": self.files_done,
                "files_total": self.files_total,
                "downloaded_bytes": self.bytes_done,
                "kept_bytes": self.bytes_skipped,
                "rate_mb_s": round(self.bytes_done / elapsed / 1e6, 2),
            },
        )
