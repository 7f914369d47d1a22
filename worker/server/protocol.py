"""OpenAI request bodies in, validated requests out; and the response bodies back.

Pure functions: every bad field becomes an :class:`ApiError` naming the field and the reason,
in OpenAI's error shape, so the HTTP layer only maps it to a response.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Literal

from strata.worker.chat_template import ChatTemplate, ChatTemplateError, Message, plain_transcript
from strata.worker.server.request_id import new_request_id

Kind = Literal["completion", "chat"]


class ApiError(Exception):
    def __init__(
        self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error"
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": None}}


@dataclass(frozen=True)
class ApiRequest:
    kind: Kind
    model: str
    prompt: str | list[int]
    max_tokens: int | None
    temperature: float
    top_p: float
    stream: bool
    stop: tuple[str, ...]
    priority: int | None
    seed: int | None
    ignore_eos: bool
    templated: bool = False
    include_usage: bool = False  # stream_options.include_usage: a last chunk with the usage
    request_id: str = field(default_factory=new_request_id)


def _bad(param: str, reason: str) -> ApiError:
    return ApiError(400, f"{param}: {reason}", param)


def _number(body: dict[str, Any], name: str, default: float, low: float, high: float) -> float:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _bad(name, "must be a number")
    if not low <= value <= high:
        raise _bad(name, f"must be between {low} and {high}")
    return float(value)


def _optional_int(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise _bad(name, "must be an integer")
    return value


def _stop(body: dict[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop) or len(stop) > 4:
        raise _bad("stop", "must be a non-empty string or a list of up to 4 of them")
    return tuple(stop)


def _include_usage(body: dict[str, Any], stream: bool) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not stream:
        raise _bad("stream_options", "is only allowed with stream: true")
    if not isinstance(options, dict):
        raise _bad("stream_options", "must be an object")
    for key in options:
        if key != "include_usage":
            raise _bad(f"stream_options.{key}", "is not supported (only include_usage)")
    include = options.get("include_usage", False)
    if not isinstance(include, bool):
        raise _bad("stream_options.include_usage", "must be a boolean")
    return include


def _prompt(body: dict[str, Any]) -> str | list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str) and prompt:
        return prompt
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        return list(prompt)
    if prompt is None:
        raise _bad("prompt", "is required")
    raise _bad("prompt", "must be a non-empty string or a list of token ids (one prompt per request)")


def chat_messages(messages: Any) -> list[Message]:
    """The request's messages, checked: each a known role with string content."""
    if not isinstance(messages, list) or not messages:
        raise _bad("messages", "must be a non-empty list")
    checked: list[Message] = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or msg.get("role") not in ("system", "user", "assistant", "tool"):
            raise _bad(f"messages[{i}].role", "must be one of system, user, assistant, tool")
        content = msg.get("content")
        if not isinstance(content, str):
            raise _bad(f"messages[{i}].content", "must be a string")
        checked.append({"role": msg["role"], "content": content})
    return checked


def render_chat(messages: Any, template: ChatTemplate | None) -> str:
    """The prompt in the model's chat format, or a plain transcript for models without one."""
    checked = chat_messages(messages)
    if template is None:
        return plain_transcript(checked)
    try:
        return template.render(checked)
    except ChatTemplateError as exc:
        raise _bad("messages", f"the model's chat template refused them: {exc}") from exc


def parse_request(
    body: Any,
    kind: Kind,
    served_model: str,
    chat_template: ChatTemplate | None = None,
    request_id: str | None = None,
) -> ApiRequest:
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("model", "is required and must be a string")
    if model != served_model:
        raise ApiError(
            404,
            f"model: {model!r} does not exist; this worker serves {served_model!r}",
            "model",
            "not_found_error",
        )
    if body.get("n", 1) != 1:
        raise _bad("n", "only 1 is supported")
    max_tokens = _optional_int(
        body, "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    )
    if max_tokens is not None and max_tokens < 1:
        raise _bad("max_tokens", "must be at least 1")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _bad("stream", "must be a boolean")
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise _bad("ignore_eos", "must be a boolean")
    prompt = render_chat(body.get("messages"), chat_template) if kind == "chat" else _prompt(body)
    return ApiRequest(
        kind=kind,
        model=model,
        prompt=prompt,
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 1e-6, 1.0),
        stream=stream,
        stop=_stop(body),
        priority=_optional_int(body, "priority"),
        seed=_optional_int(body, "seed"),
        ignore_eos=ignore_eos,
        # A rendered template already holds the model's special tokens (BOS and turn markers).
        templated=kind == "chat" and chat_template is not None,
        include_usage=_include_usage(body, stream),
        request_id=request_id or new_request_id(),
    )


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    """OpenAI's usage; ``cached_tokens``: prompt tokens served from a KV cache (any tier)."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
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


def _choice(req: ApiRequest, text: str, finish_reason: str | None, streamed: bool) -> dict[str, Any]:
    if req.kind == "chat":
        message = {"role": "assistant", "content": text}
        choice: dict[str, Any] = {"index": 0, "delta" if streamed else "message": message}
    else:
        choice = {"index": 0, "text": text, "logprobs": None}
    choice["finish_reason"] = finish_reason
    return choice


def response_body(
    req: ApiRequest, text: str, finish_reason: str | None, use: dict[str, Any]
) -> dict[str, Any]:
    """The whole (non-streamed) response."""
    body = _envelope(req, False, [_choice(req, text, finish_reason, False)])
    body["usage"] = use
    return body


def stream_chunk(req: ApiRequest, text: str, finish_reason: str | None) -> dict[str, Any]:
    """One streamed chunk; with include_usage every chunk says ``usage: null`` until the last."""
    body = _envelope(req, True, [_choice(req, text, finish_reason, True)])
    if req.include_usage:
        body["usage"] = None
    return body


def usage_chunk(req: ApiRequest, use: dict[str, Any]) -> dict[str, Any]:
    """The extra chunk before ``[DONE]`` that stream_options.include_usage asks for."""
    body = _envelope(req, True, [])
    body["usage"] = use
    return body
