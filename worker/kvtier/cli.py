"""``strata kvtier``: run the KV-tier sidecar (``serve --config PATH``); build its compiled
copy-and-checksum routine ahead of first use (``build-native``)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING

from pydantic import ValidationError

from strata.common import logs
from strata.worker.block_events import BlockEvents
from strata.worker.config import DRAIN_CUTOFF_S, WorkerConfig, engine_event_endpoints
from strata.worker.kvtier import allocator
from strata.worker.kvtier.walls import PRIVATE_UMASK

if TYPE_CHECKING:
    from strata.worker.kvtier.server import Sidecar

log = logging.getLogger(__name__)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="strata kvtier", description="The tiered KV-cache sidecar.")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the sidecar next to the engine")
    serve.add_argument(
        "--config", required=True, help="worker config file (YAML); reads its `kvtier` section"
    )
    serve.add_argument(
        "--block-bytes", type=int, default=None, help="size the tiers now instead of at the engine's hello"
    )
    serve.add_argument(
        "--metrics-port", type=int, default=None, help="override kvtier.metrics_port; 0 serves no metrics"
    )
    serve.add_argument(
        "--host", default="0.0.0.0", help="address of /metrics and /health (a pod passes its pod IP)"
    )
    serve.add_argument("--log-level", default="INFO")
    sub.add_parser(
        "build-native", help="compile the block copies' copy-and-checksum routine into the cache now"
    )
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse(argv)
    if args.command == "build-native":
        return build_native()
    logs.setup(args.log_level)
    os.umask(PRIVATE_UMASK)  # the DRAM slots, NVMe files and socket are its user's alone
    allocator.fix_thresholds()  # before the indexes are built: see allocator.py
    try:
        config = WorkerConfig.load(args.config)
    except (OSError, ValueError, ValidationError) as err:
        print(f"strata kvtier: cannot load --config {args.config}: {err}", file=sys.stderr)
        return 2
    from strata.worker.kvtier.server import Sidecar  # after the config is known good

    if args.block_bytes is not None and args.block_bytes <= 0:
        print(f"strata kvtier: --block-bytes must be > 0, got {args.block_bytes}", file=sys.stderr)
        return 2
    engine_events = BlockEvents() if config.engine.kind == "vllm" else None
    try:
        sidecar = Sidecar(
            config.kvtier,
            block_bytes=args.block_bytes,
            metrics_port=args.metrics_port,
            metrics_host=args.host,
            engine_events=engine_events,
            tenant=config.cache_namespace,
        )
        sidecar.start()
    except (OSError, ValueError) as err:  # an unwritable path, a port in use: say so, no traceback
        print(f"strata kvtier: cannot start: {err}", file=sys.stderr)
        return 1
    if engine_events is not None:
        relay_engine_events(config, engine_events, sidecar.stopping)
    received: list[signal.Signals] = []

    def stop(signum: int, frame: FrameType | None) -> None:
        received.append(signal.Signals(signum))
        sidecar.request_stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    sidecar.wait()
    _drain(
        sidecar,
        received[0] if received else None,
        config.server.drain_timeout_s + DRAIN_CUTOFF_S,
        lambda: len(received) > 1,
    )
    return 0


def relay_engine_events(config: WorkerConfig, events: BlockEvents, stop: threading.Event) -> None:
    """Follow the vLLM engine's KV events (``strata.worker.vllm.relay``) into ``events``."""
    from strata.worker.vllm.events import EngineBlocks
    from strata.worker.vllm.keys import vllm_root
    from strata.worker.vllm.relay import Endpoints, start_relay

    engine, model, namespace = config.engine, config.model.name, config.cache_namespace

    def root_of(salt: str | None, lora: str | None) -> bytes:
        return vllm_root(namespace, model, engine.block_size, engine.device, salt=salt, lora=lora)

    start_relay(
        Endpoints(*engine_event_endpoints(config.kvtier)),
        EngineBlocks(root_of, engine.block_size),
        events,
        stop,
    )


def build_native() -> int:
    """Build (or find) the library and load it once; 1 where block copies would fall back."""
    from strata.worker.kvtier import native

    logs.setup("INFO")
    routine = native.copyhash()
    if routine is None:
        print(
            "strata kvtier: no compiled copy-and-checksum; block copies take the Python path", file=sys.stderr
        )
        return 1
    print(routine.path)
    return 0


def _drain(sidecar: Sidecar, sig: signal.Signals | None, timeout_s: float, cut: Callable[[], bool]) -> None:
    """Keep serving until the engine has disconnected (it may still be draining its requests,
    when both got SIGTERM at once), then stop and say what the tiers held."""
    name = sig.name if sig is not None else "stop"
    open_now = sidecar.connections
    log.info(
        "%s: %d engine connections open; serving until they close, up to %.0f s",
        name,
        open_now,
        timeout_s,
        extra={"event": "shutdown", "signal": name, "connections": open_now, "timeout_s": timeout_s},
    )
    clean = sidecar.wait_disconnected(timeout_s, cut)
    tiers = sidecar.service.stats().get("tiers", {})
    sidecar.stop()
    blocks = {tier: held["blocks"] for tier, held in tiers.items()} if isinstance(tiers, dict) else {}
    log.info(
        "stopped: %s; blocks held %s",
        "engine disconnected" if clean else f"{sidecar.connections} connections cut",
        blocks,
        extra={"event": "stopped", "engine_disconnected": clean, "blocks": blocks},
    )
