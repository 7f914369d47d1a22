"""The KV cache's unit: a block of tokens, and the page its slots are aligned to."""

from __future__ import annotations

PAGE = 4096  # direct I/O's alignment: the tiers' slots, and a host engine's KV cache
