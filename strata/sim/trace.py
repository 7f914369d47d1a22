"""Request traces: what arrives when, how long its prompt and answer are, and which prompt
blocks it shares with earlier requests.

Two formats:

- ``mooncake`` (JSON lines, as in ../shared/data/traces): ``timestamp`` (ms), ``input_length``,
  ``output_length``, ``hash_ids`` (one id per ``block_tokens`` prompt tokens; equal ids at the
  same position are a shared prefix).
- ``arrivals`` (CSV with a header, e.g. the Azure LLM inference traces): a time column
  (``TIMESTAMP``, ``timestamp`` or ``arrival_s``; seconds or an ISO date-time), an input-token
  column (``ContextTokens`` or ``input_length``) and an output-token column
  (``GeneratedTokens`` or ``output_length``). Such traces carry no prefix information, so every
  request gets blocks of its own: nothing is ever a cache hit.
"""

from __future__ import annotations

import csv
import json
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

MOONCAKE_BLOCK_TOKENS = 512
TIME_COLUMNS = ("TIMESTAMP", "timestamp", "arrival_s")
INPUT_COLUMNS = ("ContextTokens", "input_length")
OUTPUT_COLUMNS = ("GeneratedTokens", "output_length")


class TraceError(ValueError):
    """A trace that cannot be read: the message names the file, the line and the field."""


@dataclass(frozen=True, slots=True)
class Request:
    arrival_s: float
    input_tokens: int
    output_tokens: int
    blocks: tuple[int, ...]  # prefix-chain ids, one per block_tokens of the prompt


@dataclass(frozen=True)
class Trace:
    name: str
    block_tokens: int
    requests: tuple[Request, ...]

    @property
    def span_s(self) -> float:
        return self.requests[-1].arrival_s if self.requests else 0.0

    def window(self, start_s: float = 0.0, duration_s: float | None = None) -> Trace:
        """The requests arriving in [start, start + duration), re-timed to start at 0."""
        end = math.inf if duration_s is None else start_s + duration_s
        kept = tuple(
            replace(r, arrival_s=r.arrival_s - start_s) for r in self.requests if start_s <= r.arrival_s < end
        )
        return Trace(self.name, self.block_tokens, kept)

    def scaled(self, factor: int) -> Trace:
        """Every token count divided by ``factor`` (rounded up), blocks included: the same
        requests and the same sharing, for an engine ``factor`` times slower per token."""
        if factor < 1 or self.block_tokens % factor:
            raise TraceError(f"token_scale: must divide the block size {self.block_tokens}, got {factor}")
        kept = tuple(
            replace(r, input_tokens=-(-r.input_tokens // factor), output_tokens=-(-r.output_tokens // factor))
            for r in self.requests
        )
        return Trace(self.name, self.block_tokens // factor, kept)

    def spread(self, seconds: float, seed: int = 0) -> Trace:
        """Requests that share a recorded timestamp, spread at random over the ``seconds`` after
        it. The Mooncake conversation trace records arrivals in 3-second slots (about ten
        requests share each timestamp); replayed as recorded they would arrive as bursts."""
        if seconds <= 0:
            return self
        rng = random.Random(seed)
        moved = [replace(r, arrival_s=r.arrival_s + rng.random() * seconds) for r in self.requests]
        return Trace(self.name, self.block_tokens, tuple(sorted(moved, key=lambda r: r.arrival_s)))

    def retimed(self, time_scale: float = 1.0, offset_s: float = 0.0) -> Trace:
        """Arrival times multiplied by ``time_scale`` (below 1: the same requests, faster), then
        shifted by ``offset_s``."""
        if time_scale <= 0:
            raise TraceError(f"time_scale: must be > 0, got {time_scale}")
        kept = tuple(replace(r, arrival_s=r.arrival_s * time_scale + offset_s) for r in self.requests)
        return Trace(self.name, self.block_tokens, kept)


def load(path: str | Path, fmt: str = "auto", block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> Trace:
    """Read a trace; ``fmt`` is ``mooncake``, ``arrivals`` or ``auto`` (by the file's suffix)."""
    source = Path(path)
    if fmt == "auto":
        fmt = "arrivals" if source.suffix.lower() == ".csv" else "mooncake"
    if block_tokens < 1:
        raise TraceError(f"block_tokens: must be >= 1, got {block_tokens}")
    try:
        with open(source, newline="") as lines:
            if fmt == "mooncake":
                requests = _mooncake(source, lines, block_tokens)
            elif fmt == "arrivals":
                requests = _arrivals(source, lines, block_tokens)
            else:
                raise TraceError(f"format: unknown {fmt!r}; expected mooncake, arrivals or auto")
    except OSError as err:
        raise TraceError(f"{source}: cannot read: {err.strerror or err}") from err
    if not requests:
        raise TraceError(f"{source}: no requests")
    return Trace(source.stem, block_tokens, _from_zero(sorted(requests, key=lambda r: r.arrival_s)))


def _from_zero(requests: Sequence[Request]) -> tuple[Request, ...]:
    first = requests[0].arrival_s
    return tuple(replace(r, arrival_s=r.arrival_s - first) for r in requests)


def _mooncake(source: Path, lines: Iterable[str], block_tokens: int) -> list[Request]:
    requests: list[Request] = []
    for number, line in enumerate(lines, 1):
        if line.strip():
            requests.append(_mooncake_line(f"{source}:{number}", line, block_tokens))
    return requests


def _mooncake_line(where: str, line: str, block_tokens: int) -> Request:
    try:
        raw = json.loads(line)
    except json.JSONDecodeError as err:
        raise TraceError(f"{where}: not JSON: {err.msg}") from err
    if not isinstance(raw, dict):
        raise TraceError(f"{where}: expected a JSON object")
    arrival = _number(where, raw, "timestamp") / 1000.0
    tokens_in = _count(where, raw, "input_length", minimum=1)
    tokens_out = _count(where, raw, "output_length", minimum=1)
    blocks = raw.get("hash_ids")
    if not isinstance(blocks, list) or not all(isinstance(b, int) and b >= 0 for b in blocks):
        raise TraceError(f"{where}: hash_ids: must be a list of non-negative integers")
    if len(blocks) != math.ceil(tokens_in / block_tokens):
        raise TraceError(
            f"{where}: hash_ids: {len(blocks)} ids for {tokens_in} input tokens "
            f"(expected ceil(input_length / {block_tokens}))"
        )
    return Request(arrival, tokens_in, tokens_out, tuple(blocks))


def _number(where: str, raw: dict[str, object], name: str) -> float:
    value = raw.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise TraceError(f"{where}: {name}: must be a non-negative number, got {value!r}")
    return float(value)


def _count(where: str, raw: dict[str, object], name: str, minimum: int) -> int:
    value = raw.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise TraceError(f"{where}: {name}: must be an integer >= {minimum}, got {value!r}")
    return value


def _arrivals(source: Path, lines: Iterable[str], block_tokens: int) -> list[Request]:
    reader = csv.DictReader(lines)
    header = reader.fieldnames or []
    columns = [_column(source, header, names) for names in (TIME_COLUMNS, INPUT_COLUMNS, OUTPUT_COLUMNS)]
    requests: list[Request] = []
    next_block = 0
    for number, row in enumerate(reader, 2):
        where = f"{source}:{number}"
        arrival = _time(where, columns[0], row.get(columns[0]) or "")
        values = {name: _int_cell(where, name, row.get(name) or "") for name in columns[1:]}
        tokens_in, tokens_out = values[columns[1]], values[columns[2]]
        count = math.ceil(tokens_in / block_tokens)
        # No prefix information: blocks nobody else has.
        requests.append(Request(arrival, tokens_in, tokens_out, tuple(range(next_block, next_block + count))))
        next_block += count
    return requests


def _column(source: Path, header: Sequence[str], names: Sequence[str]) -> str:
    for name in names:
        if name in header:
            return name
    raise TraceError(f"{source}: header: needs one of the columns {', '.join(names)}; found {list(header)}")


def _time(where: str, name: str, cell: str) -> float:
    try:
        return float(cell)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(cell.strip()).timestamp()
    except ValueError as err:
        raise TraceError(f"{where}: {name}: not seconds nor an ISO date-time: {cell!r}") from err


def _int_cell(where: str, name: str, cell: str) -> int:
    try:
        value = int(cell)
    except ValueError as err:
        raise TraceError(f"{where}: {name}: not an integer: {cell!r}") from err
    if value < 1:
        raise TraceError(f"{where}: {name}: must be >= 1, got {value}")
    return value
