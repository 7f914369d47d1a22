"""Trace records -> timed requests for a small test model (pure).

A Mooncake record has an arrival ``timestamp`` (ms), ``input_length``, ``output_length`` and
``hash_ids``: one id per 512-token block of the prompt, equal ids at the same position meaning
the same prefix. Here each trace block becomes ``block_tokens`` token ids drawn from a generator
seeded by the block's id, so equal ids give equal token blocks and two requests share a KV prefix
exactly as far as their ids agree. Time is compressed and token counts scaled down, so an hour of
production traffic for a 70B model becomes a few minutes that a CPU test model can serve."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

TRACE_BLOCK_TOKENS = 512  # Mooncake's hash_ids cover 512 prompt tokens each
# Printable ASCII: with a byte-level tokenizer (the test models) each id is one character, so a
# prompt can also be shown as text; any model's vocabulary has these ids.
TOKEN_LOW, TOKEN_HIGH = 32, 126


class TraceRecord(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    timestamp: int = Field(ge=0, description="arrival, ms from the trace start")
    input_length: int = Field(ge=1)
    output_length: int = Field(ge=0)
    hash_ids: tuple[int, ...] = Field(min_length=1)


@dataclass(frozen=True)
class Scaling:
    """How a trace slice is fitted to a test model and a time budget."""

    block_tokens: int = 16  # tokens per trace block: a multiple of the worker's block size
    time_compression: float = 1.0  # 10: ten seconds of trace arrive in one second
    output_scale: float = 1 / 32  # generated tokens per trace output token
    max_prompt_tokens: int = 480
    max_output_tokens: int = 32
    seed: int = 0

    def __post_init__(self) -> None:
        if self.block_tokens < 1:
            raise ValueError(f"block_tokens: must be at least 1, got {self.block_tokens}")
        if self.time_compression <= 0:
            raise ValueError(f"time_compression: must be > 0, got {self.time_compression}")
        if self.max_prompt_tokens < 1 or self.max_output_tokens < 1:
            raise ValueError("max_prompt_tokens, max_output_tokens: must be at least 1")


@dataclass(frozen=True)
class TimedRequest:
    at_s: float  # send this long after the replay starts
    prompt: tuple[int, ...]  # token ids
    max_tokens: int
    blocks: tuple[int, ...]  # the trace's hash_ids this prompt is made of


class TraceError(ValueError):
    """A trace line that is not a Mooncake record; the message names the line and the field."""


def read_trace(path: Path, start: int = 0, count: int | None = None) -> list[TraceRecord]:
    """Records ``start`` .. ``start + count`` of a JSONL trace (all the rest when count is None)."""
    records: list[TraceRecord] = []
    with path.open() as lines:
        for number, line in enumerate(lines, 1):
            if number <= start or not line.strip():
                continue
            if count is not None and len(records) >= count:
                break
            records.append(_record(path, number, line))
    return records


def _record(path: Path, number: int, line: str) -> TraceRecord:
    try:
        return TraceRecord.model_validate(json.loads(line))
    except json.JSONDecodeError as exc:
        raise TraceError(f"{path}:{number}: not JSON: {exc}") from None
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"])
        raise TraceError(f"{path}:{number}: {field}: {err['msg']}") from None


def block_tokens(hash_id: int, n: int, seed: int = 0) -> tuple[int, ...]:
    """The token ids standing for one trace block: the same id gives the same tokens."""
    draw = random.Random(hash_id * 1_000_003 + seed)
    return tuple(draw.randint(TOKEN_LOW, TOKEN_HIGH) for _ in range(n))


def timed_requests(records: Sequence[TraceRecord], scaling: Scaling) -> list[TimedRequest]:
    """The slice as requests, the first arriving at 0 s."""
    if not records:
        return []
    t0 = records[0].timestamp
    return [_timed(r, (r.timestamp - t0) / 1000 / scaling.time_compression, scaling) for r in records]


def _timed(record: TraceRecord, at_s: float, scaling: Scaling) -> TimedRequest:
    wanted = math.ceil(record.input_length * scaling.block_tokens / TRACE_BLOCK_TOKENS)
    length = max(1, min(wanted, scaling.max_prompt_tokens))
    blocks = record.hash_ids[: math.ceil(length / scaling.block_tokens)]
    prompt = tuple(t for h in blocks for t in block_tokens(h, scaling.block_tokens, scaling.seed))[:length]
    output = max(1, min(round(record.output_length * scaling.output_scale), scaling.max_output_tokens))
    return TimedRequest(at_s, prompt, output, blocks)


def shared_prefix_tokens(requests: Iterable[TimedRequest], block_tokens_: int) -> int:
    """Prompt tokens whose block prefix an earlier request already sent: what an unbounded
    prefix cache could serve (a check that the replay reuses what the trace reuses)."""
    seen: set[tuple[int, ...]] = set()
    shared = 0
    for request in requests:
        for i in range(1, len(request.blocks) + 1):
            prefix = request.blocks[:i]
            if prefix in seen and i * block_tokens_ <= len(request.prompt):
                shared += block_tokens_
            seen.add(prefix)
    return shared
