"""Incremental detokenization for streaming, with OpenAI ``stop`` strings.

Text is emitted only once it can no longer change: a trailing partial UTF-8 character, or a tail
that might be the start of a stop string, is held back until the next tokens decide it.
"""

from __future__ import annotations

from strata.worker.tokenizer import Tokenizer


def shown_tokens(token_ids: list[int], finish_reason: str | None) -> list[int]:
    """The tokens whose text the completion shows: not the one that stopped generation (an EOS
    or a request's ``stop_token_ids``), special or not, as vLLM leaves it out."""
    return token_ids[:-1] if finish_reason == "stop" else token_ids


def held_back(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest tail of ``text`` that begins some stop string."""
    longest = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), longest, -1):
            if stop.startswith(text[-size:]):
                longest = size
                break
    return longest


class Detokenizer:
    def __init__(self, tokenizer: Tokenizer, stops: tuple[str, ...] = ()) -> None:
        self.tokenizer = tokenizer
        self.stops = stops
        self.token_ids: list[int] = []
        self.text = ""  # emitted so far
        self.stopped = False

    def feed(self, token_ids: list[int], final: bool = False) -> str:
        """New text to emit after ``token_ids``; sets ``stopped`` when a stop string appears."""
        self.token_ids += token_ids
        full = self.tokenizer.decode(self.token_ids)
        cut = min((i for i in (full.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            full, self.stopped, final = full[:cut], True, True
        if not final:
            keep = held_back(full, self.stops)
            full = full[: len(full) - keep]
            if full.endswith("\ufffd"):  # maybe the first bytes of a character still coming
                full = full[:-1]
        delta = full[len(self.text) :] if full.startswith(self.text) else ""
        self.text += delta
        return delta
