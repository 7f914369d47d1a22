"""Per-tier Prometheus metrics of the sidecar, and the small HTTP server for /metrics and /health."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from io import BufferedIOBase
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from strata.common.endpoints import ENGINE_EVENTS_PATH, EVENTS_PATH, EXPECT_PATH
from strata.worker import block_events
from strata.worker.block_events import BlockEvents
from strata.worker.kvtier import protocol
from strata.worker.kvtier.janitor import Sweep

_PREFIX = "strata_kvtier_"
LOOKAHEAD_SOURCES = ("engine", "routers")  # the worker's own queue, and the routers' (POST /kv/expect)
_LATENCY_BUCKETS = (1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0)


class TierMetrics:
    """The tiers' series carry a ``tier`` label (dram, nvme or shared); the look-ahead's a
    ``source`` label: ``engine`` (the worker's own queue) or ``routers`` (``POST /kv/expect``)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry

        def counter(name: str, doc: str) -> Counter:
            return Counter(_PREFIX + name, doc, ["tier"], registry=r)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(_PREFIX + name, doc, ["tier"], registry=r)

        self.used_bytes = gauge("used_bytes", "Bytes of blocks held.")
        self.blocks = gauge("blocks", "Blocks held.")
        self.capacity_bytes = gauge("capacity_bytes", "Bytes the tier may hold.")
        self.configured_bytes = gauge(
            "configured_bytes",
            "The tier's configured size; above capacity_bytes where the sidecar fitted the tier's index "
            "within its memory.",
        )
        self.hits = counter("hits", "Blocks found in the tier on lookup.")
        self.misses = counter("misses", "Lookups that ended at this tier (the first missing block).")
        self.evictions = counter("evictions", "Blocks evicted from the tier.")
        self.promotions = counter("promotions", "Blocks copied up into the tier from a lower one.")
        self.demotions = counter("demotions", "Blocks written down into the tier from a higher one.")
        self.read_bytes = counter("read_bytes", "Block bytes read from the tier.")
        self.written_bytes = counter("written_bytes", "Block bytes written to the tier.")
        self.corrupt_blocks = counter("corrupt_blocks", "Blocks that failed their checksum (dropped).")
        self.recovered_blocks = counter(
            "recovered_blocks", "Blocks found again at start (warm restart) and verified."
        )
        self._movement(counter, gauge)
        self._direct(counter)
        self._lookahead(r)

        def latency(name: str, doc: str) -> Histogram:
            return Histogram(_PREFIX + name, doc, ["tier"], buckets=_LATENCY_BUCKETS, registry=r)

        self.read_seconds = latency("read_seconds", "Latency of a batch read.")
        self.write_seconds = latency("write_seconds", "Latency of a batch write.")

    def _movement(self, counter: Callable[[str, str], Counter], gauge: Callable[[str, str], Gauge]) -> None:
        """Prefetch, admission, I/O errors and the shared volume's janitor, by tier."""
        self.prefetched = counter(
            "prefetched",
            "Blocks moved up to DRAM ahead of a request (look-ahead and prefetch hints), by the tier "
            "they came from.",
        )
        self.prefetch_used = counter(
            "prefetch_used",
            "Prefetched blocks a request then asked for, served from DRAM instead of the tier they "
            "came from (also counted in that tier's hits).",
        )
        self.read_waits = counter(
            "read_waits",
            "Blocks a load found still being read up from the tier by another request (mostly the "
            "look-ahead's prefetch, started late) and waited for, rather than reading them twice.",
        )
        for lower in ("nvme", "shared"):  # their series exist from the start, at 0
            for family in (self.prefetched, self.prefetch_used, self.read_waits):
                family.labels(lower)
        self.admitted = counter("admitted", "Blocks offered to the tier that its admission policy let in.")
        self.refused = counter("refused", "Blocks offered to the tier that its admission policy kept out.")
        self.doorkeeper = gauge(
            "admission_doorkeeper",
            "1 while the tier admits only blocks seen before (doorkeeper, or adaptive following it).",
        )
        self.errors = counter("io_errors", "I/O errors (full disk, unreachable store); the tier degraded.")
        self.full = gauge(
            "volume_full",
            "1 while the tier admits no blocks because a write found its volume full (ENOSPC); reads go "
            "on, and writes are tried again after a while.",
        )
        self.full.labels("nvme").set(0)
        self.volume_bytes = gauge(
            "volume_bytes",
            "Bytes the whole shared volume held (every worker's blocks) at the janitor's last sweep; "
            "reported by the sidecar that is the volume's janitor.",
        )
        self.janitor_removed = counter(
            "janitor_removed",
            "Files the shared volume's janitor removed: least recently used blocks above the "
            "volume's size, and temporary files their writers left.",
        )

    def _direct(self, counter: Callable[[str, str], Counter]) -> None:
        """The share of NVMe's traffic an engine moved itself (``direct_io``): it is also in
        ``read_bytes`` and ``written_bytes``, and 0 where no engine asks for it or the sidecar
        does not offer it (its log says why)."""
        self.direct_read_bytes = counter(
            "direct_read_bytes",
            "Block bytes an engine read from the tier's slots itself (direct_io), as the sidecar leased "
            "them; also in read_bytes.",
        )
        self.direct_written_bytes = counter(
            "direct_written_bytes",
            "Block bytes an engine wrote into the tier's slots itself (direct_io), once the sidecar "
            "committed them; also in written_bytes.",
        )
        for family in (self.direct_read_bytes, self.direct_written_bytes):
            family.labels("nvme")  # the only tier an engine writes itself; at 0 from the start

    def _lookahead(self, r: CollectorRegistry) -> None:
        """The look-ahead's series, by ``source``; both sources' exist from the start, at 0."""
        doc = {
            "requests": "Queued requests whose blocks the sidecar keeps and moves up to DRAM (look-ahead).",
            "blocks": "Blocks the look-ahead's requests will ask for.",
            "refused": "Queued requests not announced: past the look-ahead's bound on blocks.",
        }
        name = {what: f"{_PREFIX}lookahead_{what}" for what in doc}
        self.lookahead_requests = Gauge(name["requests"], doc["requests"], ["source"], registry=r)
        self.lookahead_blocks = Gauge(name["blocks"], doc["blocks"], ["source"], registry=r)
        self.lookahead_refused = Counter(name["refused"], doc["refused"], ["source"], registry=r)
        for source in LOOKAHEAD_SOURCES:
            for family in (self.lookahead_requests, self.lookahead_blocks, self.lookahead_refused):
                family.labels(source)

    def swept(self, sweep: Sweep) -> None:
        """The shared volume's janitor swept it."""
        self.volume_bytes.labels("shared").set(sweep.left_bytes)
        self.janitor_removed.labels("shared").inc(sweep.removed_stale + sweep.removed_lru)

    def render(self) -> bytes:
        return bytes(generate_latest(self.registry))


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    closing: threading.Event

    def shutdown(self) -> None:
        self.closing.set()  # ends the block-event streams, whose threads would outlive us
        super().shutdown()


def _announce(
    announce: Callable[[Any], dict[str, Any]], length: str | None, body: BufferedIOBase
) -> tuple[int, dict[str, Any]]:
    """The HTTP answer to a router's announcement: 200 and what was announced, 400 naming what is
    wrong with it, 409 for a change to a set not held here, 413 past
    ``protocol.EXPECT_MAX_BODY_BYTES``, 503 before the engine's hello."""
    size = int(length) if length and length.isdigit() else -1
    if not 0 <= size <= protocol.EXPECT_MAX_BODY_BYTES:
        return 413, {"error": f"Content-Length: expected 0 to {protocol.EXPECT_MAX_BODY_BYTES} bytes"}
    try:
        return 200, announce(json.loads(body.read(size) or b"null"))
    except ValueError as err:  # JSON that does not parse, or a field that is wrong
        return 400, {"error": str(err)}
    except protocol.ExpectConflict as err:
        return 409, {"error": str(err)}
    except RuntimeError as err:
        return 503, {"error": str(err)}


def serve_http(
    port: int,
    metrics: TierMetrics,
    healthy: Callable[[], bool],
    host: str = "0.0.0.0",
    events: BlockEvents | None = None,
    announce: Callable[[Any], dict[str, Any]] | None = None,
    engine_events: BlockEvents | None = None,
) -> ThreadingHTTPServer:
    """Serve /metrics, /health and (with ``events``) the tiers' block events on /kv/events, (with
    ``engine_events``) a vLLM engine's on /kv/engine-events, and (with ``announce``) the routers'
    queued requests on ``POST /kv/expect``, on daemon threads; returns the server (``shutdown()``
    it)."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            if self.path != EXPECT_PATH or announce is None:
                self._reply(404, b"not found\n", "text/plain")
                return
            code, answer = _announce(announce, self.headers.get("Content-Length"), self.rfile)
            self._reply(code, json.dumps(answer).encode(), "application/json")

        def do_GET(self) -> None:
            if self.path == EVENTS_PATH and events is not None:
                self._stream(events)
            elif self.path == ENGINE_EVENTS_PATH and engine_events is not None:
                self._stream(engine_events)
            elif self.path == "/metrics":
                self._reply(200, metrics.render(), CONTENT_TYPE_LATEST)
            elif self.path == "/health":
                ok = healthy()
                self._reply(200 if ok else 503, b"ok\n" if ok else b"not ready\n", "text/plain")
            else:
                self._reply(404, b"not found\n", "text/plain")

        def _stream(self, events: BlockEvents) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/x-ndjson")
            self.end_headers()
            self.wfile.flush()

            def write(data: bytes) -> None:
                self.wfile.write(data)
                self.wfile.flush()

            with contextlib.suppress(OSError):  # the follower left
                block_events.follow(events, write, server.closing)

        def _reply(self, code: int, body: bytes, content_type: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # quiet at INFO
            pass

    server = _Server((host, port), Handler)
    server.closing = threading.Event()
    threading.Thread(target=server.serve_forever, name="kvtier-http", daemon=True).start()
    return server
