"""OpenAI response bodies: whole responses, streamed chunks, usage and logprobs."""

from __future__ import annotations

import time
from typing import Any

from strata.common.openai.protocol import ApiRequest
from strata.worker.engine.sequence import TokenLogprob
from strata.worker.tokenizer import Tokenizer


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    """OpenAI's usage; ``cached_tokens``: prompt tokens served from a KV cache (any tier)."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


class LogprobsFormat:
    """Engine logprobs in the shape of the request's endpoint. Completions number each token's
    place in the text (``text_offset``), which runs on across streamed chunks."""

    def __init__(self, tokenizer: Tokenizer, req: ApiRequest) -> None:
        self.tokenizer, self.req = tokenizer, req
        self.offset = 0

    def _text(self, token_id: int) -> str:
        return self.tokenizer.token_bytes(token_id).decode("utf-8", errors="replace")

    def _chat_entry(self, token_id: int, logprob: float) -> dict[str, Any]:
        raw = self.tokenizer.token_bytes(token_id)
        return {"token": self._text(token_id), "logprob": logprob, "bytes": list(raw)}

    def body(self, entries: list[TokenLogprob]) -> dict[str, Any] | None:
        if self.req.logprobs is None:
            return None
        if self.req.kind == "chat":
            content = [
                {
                    **self._chat_entry(e.token_id, e.logprob),
                    "top_logprobs": [self._chat_entry(*t) for t in e.top],
                }
                for e in entries
            ]
            return {"content": content, "refusal": None}
        texts = [self._text(e.token_id) for e in entries]
        offsets = []
        for text in texts:
            offsets.append(self.offset)
            self.offset += len(text)
        return {
            "tokens": texts,
            "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [
                {self._text(t): lp for t, lp in (*e.top, (e.token_id, e.logprob))} for e in entries
            ],
            "text_offset": offsets,
        }


def _envelope(req: ApiRequest, streamed: bool, choices: list[dict[str, Any]]) -> dict[str, Any]:
    chat_object = "chat.completion.chunk" if streamed else "chat.completion"
    return {
        "id": f"{'chatcmpl' if req.kind == 'chat' else 'cmpl'}-{req.request_id}",
        "object": chat_object if req.kind == "chat" else "text_completion",
        "created": int(time.time()),
        "model": req.model,
        "choices": choices,
    }


def _choice(
    req: ApiRequest, text: str, finish_reason: str | None, logprobs: dict[str, Any] | None, streamed: bool
) -> dict[str, Any]:
    if req.kind == "chat":
        message = {"role": "assistant", "content": text}
        choice: dict[str, Any] = {"index": 0, "delta" if streamed else "message": message}
    else:
        choice = {"index": 0, "text": text}
    choice["logprobs"] = logprobs
    choice["finish_reason"] = finish_reason
    return choice


def response_body(
    req: ApiRequest,
    text: str,
    finish_reason: str | None,
    logprobs: dict[str, Any] | None,
    use: dict[str, Any],
) -> dict[str, Any]:
    """The whole (non-streamed) response."""
    body = _envelope(req, False, [_choice(req, text, finish_reason, logprobs, False)])
    body["usage"] = use
    return body


def stream_chunk(
    req: ApiRequest, text: str, finish_reason: str | None, logprobs: dict[str, Any] | None
) -> dict[str, Any]:
    """One streamed chunk; with include_usage every chunk says ``usage: null`` until the last."""
    body = _envelope(req, True, [_choice(req, text, finish_reason, logprobs, True)])
    if req.include_usage:
        body["usage"] = None
    return body


def usage_chunk(req: ApiRequest, use: dict[str, Any]) -> dict[str, Any]:
    """The extra chunk before ``[DONE]`` that stream_options.include_usage asks for."""
    body = _envelope(req, True, [])
    body["usage"] = use
    return body
