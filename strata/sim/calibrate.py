"""Fitting a profile's step costs to measurements of a real engine.

Three kinds of measurement, each of one request or batch alone on an idle engine:

- ``Decode(batch, context, step_s)``: a decode step of ``batch`` sequences of ``context`` tokens;
- ``Prefill(tokens, seconds)``: the TTFT of a cold prompt (chunked by ``max_batched_tokens``);

The decode steps give ``overhead_s``, ``decode_seq_s`` and ``decode_context_token_s`` (least
squares over ``1, batch, batch * context``); the prefills, with that overhead, give
``request_overhead_s``, ``prefill_token_s`` and ``attention_pair_s`` (least squares over
``1, tokens, token pairs``; a cost the data say is negative, as a busy machine's noise can, is
held at zero and the rest fitted again). The intercept is what a request costs outside the
engine when its TTFT is measured by a client: without it, the HTTP path of a short prompt was
spread over the per-token cost. ``floor_s`` is zero: on a CPU the weights are read in cache-sized
pieces during compute, so there is no separate memory floor.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Decode:
    batch: int
    context: int
    step_s: float


@dataclass(frozen=True)
class Prefill:
    tokens: int
    seconds: float


@dataclass(frozen=True)
class StepCosts:
    overhead_s: float
    decode_seq_s: float
    decode_context_token_s: float
    prefill_token_s: float
    attention_pair_s: float
    request_overhead_s: float = 0.0


def fit(decodes: Sequence[Decode], prefills: Sequence[Prefill], chunk: int) -> StepCosts:
    if len(decodes) < 3 or len(prefills) < 2:
        raise ValueError("calibration: needs at least 3 decode and 2 prefill measurements")
    rows = [[1.0, float(d.batch), float(d.batch * d.context)] for d in decodes]
    overhead, per_seq, per_ctx = least_squares(rows, [d.step_s for d in decodes])
    overhead = max(0.0, overhead)
    steps = [_chunks(p.tokens, chunk) for p in prefills]
    rest = [p.seconds - len(c) * overhead for p, c in zip(prefills, steps, strict=True)]
    rows = [[1.0, float(p.tokens), _pairs(c)] for p, c in zip(prefills, steps, strict=True)]
    request, per_token, per_pair = non_negative(rows, rest)
    if per_token <= 0:
        timings = ", ".join(f"{p.tokens} tokens {p.seconds * 1000:.1f} ms" for p in prefills)
        raise ValueError(f"calibration: the prefill timings give no cost per token (noise?): {timings}")
    return StepCosts(overhead, max(0.0, per_seq), max(0.0, per_ctx), per_token, per_pair, request)


def non_negative(rows: Sequence[Sequence[float]], values: Sequence[float]) -> list[float]:
    """Least squares with every coefficient >= 0: a negative one is held at zero and the others
    fitted again, until none is (a handful of unknowns)."""
    free = list(range(len(rows[0])))
    while True:
        fitted = least_squares([[r[i] for i in free] for r in rows], values)
        if all(x >= 0 for x in fitted):
            out = [0.0] * len(rows[0])
            for i, x in zip(free, fitted, strict=True):
                out[i] = x
            return out
        free.pop(min(range(len(free)), key=lambda k: fitted[k]))
        if not free:
            return [0.0] * len(rows[0])


def _chunks(tokens: int, chunk: int) -> list[tuple[int, int]]:
    """(new tokens, context before) of each prefill step."""
    return [(min(chunk, tokens - start), start) for start in range(0, tokens, chunk)]


def _pairs(chunks: Sequence[tuple[int, int]]) -> float:
    return sum(n * (context + n / 2) for n, context in chunks)


def least_squares(rows: Sequence[Sequence[float]], values: Sequence[float]) -> list[float]:
    """Solve the normal equations of ``rows @ x ~= values`` (a handful of unknowns)."""
    n = len(rows[0])
    a = [[sum(r[i] * r[j] for r in rows) for j in range(n)] for i in range(n)]
    b = [sum(r[i] * v for r, v in zip(rows, values, strict=True)) for i in range(n)]
    return _solve(a, b)


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting."""
    n = len(b)
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        if a[pivot][col] == 0:
            raise ValueError("calibration: measurements do not determine the costs (singular system)")
        a[col], a[pivot], b[col], b[pivot] = a[pivot], a[col], b[pivot], b[col]
        for row in range(col + 1, n):
            factor = a[row][col] / a[col][col]
            a[row] = [x - factor * y for x, y in zip(a[row], a[col], strict=True)]
            b[row] -= factor * b[col]
    x = [0.0] * n
    for row in range(n - 1, -1, -1):
        x[row] = (b[row] - sum(a[row][k] * x[k] for k in range(row + 1, n))) / a[row][row]
    return x
