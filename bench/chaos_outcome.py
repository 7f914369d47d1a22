"""What one request of the chaos benchmark came to, and what a fault's row adds up to (pure).

A response is classified from what its client saw alone: an answer (the stream reached its end),
a refusal the platform owns up to (429 or 503 with ``Retry-After``: the client knows to come
back), a loss (the connection dropped, timed out or got a 5xx without retry guidance before any
token arrived: the platform took the request and said nothing useful), or a cut (a stream already
under way that broke off). A row counts them over the requests sent during one fault, compares
the answers with a reference run at temperature 0, and says how long the service took to be
Ready again and back to its hit ratio.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

REFUSAL_STATUSES = (429, 503)
HIT_WINDOW = 10  # answered requests whose mean hit ratio says the cache is back
HIT_BACK_SHARE = 0.8  # of the steady hit ratio before the fault


class Kind(StrEnum):
    ANSWERED = "answered"
    REFUSED = "refused"
    LOST = "lost"
    CUT = "cut"


@dataclass(frozen=True)
class Response:
    """One request as its client saw it. ``status`` None: no HTTP status arrived (the
    connection failed or closed first); ``tokens`` streamed before the end or the break."""

    sent_s: float
    done_s: float
    prompt: int  # index into the benchmark's prompt pool
    status: int | None = None
    retry_after: bool = False
    tokens: int = 0
    finished: bool = False  # the stream's final event ([DONE]) arrived
    text: str = ""
    prompt_tokens: int = 0
    cached_tokens: int = 0
    error: str = ""


def classify(response: Response) -> Kind:
    if response.status == 200 and response.finished:
        return Kind.ANSWERED
    if response.tokens > 0:
        return Kind.CUT
    if response.status in REFUSAL_STATUSES and response.retry_after:
        return Kind.REFUSED
    return Kind.LOST


@dataclass(frozen=True)
class Row:
    fault: str
    sent: int
    answered: int
    refused: int
    lost: int
    cut: int
    wrong_output: int
    corrupt_served: int
    recovery_s: float | None  # None: not Ready or not back to its hit ratio within the bound
    hit_ratio: float | None  # over the row's answered requests
    errors: tuple[str, ...] = ()  # the distinct errors of lost and cut requests, a few

    def as_json(self) -> dict[str, object]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.__dict__.items()}


def wrong_outputs(responses: Sequence[Response], reference: Mapping[int, str]) -> int:
    """Answers whose text differs from the reference run's for the same prompt."""
    answered = [r for r in responses if classify(r) is Kind.ANSWERED and r.prompt in reference]
    return sum(r.text != reference[r.prompt] for r in answered)


def hit_ratio(responses: Sequence[Response]) -> float | None:
    """Cached prompt tokens over prompt tokens of the answered requests."""
    answered = [r for r in responses if classify(r) is Kind.ANSWERED]
    prompt = sum(r.prompt_tokens for r in answered)
    return round(sum(r.cached_tokens for r in answered) / prompt, 4) if prompt else None


def hit_ratio_back_at(
    responses: Sequence[Response], since_s: float, target: float, window: int = HIT_WINDOW
) -> float | None:
    """When, at or after ``since_s``, the last ``window`` answers (by completion) first reached
    ``target`` hit ratio; None if they never did."""
    answered = sorted((r for r in responses if classify(r) is Kind.ANSWERED), key=lambda r: r.done_s)
    for end in range(window, len(answered) + 1):
        last = answered[end - window : end]
        if last[-1].done_s >= since_s and (hit_ratio(last) or 0.0) >= target:
            return last[-1].done_s
    return None


def recovery_s(
    responses: Sequence[Response], fault_s: float, ready_s: float | None, steady_hit: float | None
) -> float | None:
    """From the fault until the service was Ready again (``ready_s``) and its answers were back
    to ``HIT_BACK_SHARE`` of the steady hit ratio; None when either never happened."""
    if ready_s is None:
        return None
    back = ready_s
    if steady_hit:
        back_at = hit_ratio_back_at(responses, ready_s, HIT_BACK_SHARE * steady_hit)
        if back_at is None:
            return None
        back = back_at
    return round(max(back, ready_s) - fault_s, 2)


def row(
    fault: str,
    responses: Sequence[Response],
    reference: Mapping[int, str],
    corrupt_served: int,
    recovery: float | None,
) -> Row:
    kinds = [classify(r) for r in responses]
    failed = [r for r, k in zip(responses, kinds, strict=True) if k in (Kind.LOST, Kind.CUT)]
    return Row(
        fault=fault,
        sent=len(responses),
        answered=kinds.count(Kind.ANSWERED),
        refused=kinds.count(Kind.REFUSED),
        lost=kinds.count(Kind.LOST),
        cut=kinds.count(Kind.CUT),
        wrong_output=wrong_outputs(responses, reference),
        corrupt_served=corrupt_served,
        recovery_s=recovery,
        hit_ratio=hit_ratio(responses),
        errors=tuple(sorted({_error(r) for r in failed}))[:5],
    )


def _error(response: Response) -> str:
    if response.error:
        return response.error
    return "stream ended early" if response.status == 200 else f"HTTP {response.status}"


COLUMNS = ("sent", "answered", "refused", "lost", "cut", "wrong_output", "corrupt_served", "recovery_s")


def table(rows: Sequence[Row]) -> list[str]:
    """The summary the benchmark prints: one line a fault, then the totals."""
    width = max([len("fault"), *(len(r.fault) for r in rows)])
    lines = [f"{'fault':<{width}}" + "".join(f"{c:>15}" for c in COLUMNS)]
    for r in rows:
        cells = [getattr(r, c) for c in COLUMNS]
        lines.append(f"{r.fault:<{width}}" + "".join(f"{_cell(v):>15}" for v in cells))
    totals = [sum(getattr(r, c) for r in rows) for c in COLUMNS[:-1]]
    lines.append(f"{'total':<{width}}" + "".join(f"{v:>15}" for v in totals) + f"{'':>15}")
    return lines


def _cell(value: object) -> str:
    if value is None:
        return "not back"
    return f"{value:.1f}" if isinstance(value, float) else str(value)
