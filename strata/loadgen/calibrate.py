"""How much load one replica takes, measured, so a replay can be sized to this machine.

A closed loop: ``concurrency`` clients each send the next request as soon as their last one
finished, for ``duration_s``; completions per second is the replica's throughput with continuous
batching at that depth. A demo that wants a replica overloaded into queueing, but not so far that
the queue grows without bound, replays at a share of it (``compression_for``)."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Sequence

import openai

from strata.loadgen.replay import send
from strata.loadgen.trace import TimedRequest


async def throughput(
    client: openai.AsyncOpenAI,
    model: str,
    requests: Sequence[TimedRequest],
    concurrency: int = 8,
    duration_s: float = 10.0,
) -> float:
    """Completed requests per second (errors do not count), cycling through ``requests``."""
    if not requests or concurrency < 1 or duration_s <= 0:
        raise ValueError("throughput: needs requests, concurrency >= 1 and duration_s > 0")
    feed = itertools.cycle(requests)
    started = time.monotonic()
    done = 0

    async def client_loop() -> None:
        nonlocal done
        while time.monotonic() - started < duration_s:
            outcome = await send(client, model, next(feed), time.monotonic() - started)
            done += outcome.error is None

    await asyncio.gather(*(client_loop() for _ in range(concurrency)))
    return done / (time.monotonic() - started)


def compression_for(requests: Sequence[TimedRequest], rate_per_s: float) -> float:
    """The time compression that makes a slice (as replayed at compression 1) arrive at
    ``rate_per_s`` on average."""
    span = requests[-1].at_s - requests[0].at_s if len(requests) > 1 else 0.0
    if span <= 0 or rate_per_s <= 0:
        raise ValueError("compression_for: needs a slice spanning some time and a positive rate")
    return rate_per_s / (len(requests) / span)
