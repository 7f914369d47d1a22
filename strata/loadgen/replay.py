"""Send timed requests at an OpenAI endpoint, as clients would, and record what each one saw.

Every request streams (``stream_options.include_usage``), so the time to the first token is the
client's own and the final usage chunk carries the cached prompt tokens. Arrivals keep the
trace's schedule: a request is sent at its time whether or not earlier ones have finished (an
open loop, as real users behave), up to ``max_in_flight`` at once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

import openai

from strata.loadgen.summary import Outcome
from strata.loadgen.trace import TimedRequest

OnDone = Callable[[Outcome], None]


async def replay(
    client: openai.AsyncOpenAI,
    model: str,
    requests: Sequence[TimedRequest],
    on_done: OnDone | None = None,
    max_in_flight: int = 256,
    stop: asyncio.Event | None = None,
) -> list[Outcome]:
    """The outcome of every request sent, in arrival order. Once ``stop`` is set nothing more is
    sent and the call returns when what was in flight has finished; cancelling the call cancels
    what is in flight."""
    started = time.monotonic()
    limit = asyncio.Semaphore(max_in_flight)

    async def timed(request: TimedRequest) -> Outcome | None:
        delay = max(0.0, request.at_s - (time.monotonic() - started))
        if stop is None:
            await asyncio.sleep(delay)
        elif await _stopped_within(stop, delay):
            return None
        async with limit:
            if stop is not None and stop.is_set():
                return None
            outcome = await send(client, model, request, time.monotonic() - started)
        if on_done is not None:
            on_done(outcome)
        return outcome

    sent = await asyncio.gather(*(timed(r) for r in requests))
    return [o for o in sent if o is not None]


async def _stopped_within(stop: asyncio.Event, delay_s: float) -> bool:
    try:
        await asyncio.wait_for(stop.wait(), delay_s)
    except TimeoutError:
        return False
    return True


async def send(client: openai.AsyncOpenAI, model: str, request: TimedRequest, sent_s: float) -> Outcome:
    begin = time.monotonic()
    ttft: float | None = None
    cached = 0
    try:
        stream = await client.completions.create(
            model=model,
            prompt=list(request.prompt),
            max_tokens=request.max_tokens,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        async for chunk in stream:
            if ttft is None and chunk.choices:
                ttft = time.monotonic() - begin
            details = chunk.usage.prompt_tokens_details if chunk.usage is not None else None
            if details is not None and details.cached_tokens is not None:
                cached = details.cached_tokens
    except openai.APIStatusError as exc:
        return Outcome(sent_s, len(request.prompt), ttft, error=f"HTTP {exc.status_code}: {exc.message}")
    except openai.APIError as exc:
        return Outcome(sent_s, len(request.prompt), ttft, error=f"{type(exc).__name__}: {exc}")
    return Outcome(sent_s, len(request.prompt), ttft, time.monotonic() - begin, cached)
