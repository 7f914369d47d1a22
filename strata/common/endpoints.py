"""Where the planes reach each other: the ports and HTTP paths that the operator renders, the
router dials and the worker and its KV-tier sidecar serve."""

from __future__ import annotations

WORKER_PORT = 8000  # the worker's OpenAI API, /health, /ready, /metrics and /kv/events
SIDECAR_PORT = 8001  # the KV-tier sidecar's /metrics, /health, /kv/events and /kv/expect
ROUTER_PORT = WORKER_PORT  # on the router pods' own IPs: the port clients always used

EVENTS_PATH = "/kv/events"  # a worker's and a sidecar's stream of the blocks they hold
# A vLLM engine's HBM blocks, relayed by its KV-tier sidecar (``strata.worker.vllm.relay``).
ENGINE_EVENTS_PATH = "/kv/engine-events"
# The routers' look-ahead: the requests they will send a replica, announced to its sidecar.
EXPECT_PATH = "/kv/expect"
