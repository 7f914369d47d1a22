"""The KV cache's unit: a block of tokens, and the page its slots are aligned to."""

from __future__ import annotations

BLOCK_SIZE = 16  # tokens per KV block, unless a service asks for another size
PAGE = 4096  # direct I/O's alignment: the tiers' slots, and a host engine's KV cache
