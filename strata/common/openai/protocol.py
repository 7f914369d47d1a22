"""OpenAI request bodies in, validated requests out.

Pure functions: every bad field becomes an :class:`ApiError` naming the field and the reason, in
OpenAI's error shape, so the HTTP layer only maps it to a response. A field the worker does not
implement (tools, response_format, n > 1, penalties, ...) is refused by name, never silently
ignored: a client that asked for JSON output must not get free text. Torch-free: the router
validates requests with it, so it gives the worker's errors without touching a worker.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from strata.common.openai.chat_template import ChatTemplate
from strata.common.openai.errors import ApiError as ApiError  # the router imports it from here
from strata.common.openai.errors import bad
from strata.common.openai.messages import render_chat
from strata.common.openai.request_id import new_request_id

Kind = Literal["completion", "chat"]
MAX_LOGPROBS = 20
SAMPLING = ("model", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stop_token_ids")
COMMON = (*SAMPLING, "stream", "stream_options", "user", "logprobs", "priority", "ignore_eos")
FIELDS: dict[Kind, frozenset[str]] = {
    "completion": frozenset((*COMMON, "prompt")),
    "chat": frozenset((*COMMON, "messages", "max_completion_tokens", "top_logprobs")),
}
# Accepted only at the value that turns them off: any other value asks for a missing feature.
OFF_VALUES: dict[str, Any] = {
    "n": 1,
    "best_of": 1,
    "echo": False,
    "presence_penalty": 0,
    "frequency_penalty": 0,
    "logit_bias": {},
    "suffix": "",
    "tools": [],
    "tool_choice": "none",
    "response_format": {"type": "text"},
}


@dataclass(frozen=True)
class ApiRequest:
    kind: Kind
    model: str
    prompt: str | list[int]
    max_tokens: int | None
    temperature: float | None  # None: the model's generation_config.json default, else 1
    top_p: float | None
    top_k: int | None
    stream: bool
    stop: tuple[str, ...]
    stop_token_ids: tuple[int, ...]
    priority: int | None
    seed: int | None
    ignore_eos: bool
    logprobs: int | None = None  # None: no logprobs; k: the sampled token's and the top k
    templated: bool = False
    include_usage: bool = False  # stream_options.include_usage: a last chunk with the usage
    user: str | None = None
    request_id: str = field(default_factory=new_request_id)


def _is_off(name: str, value: Any) -> bool:
    off = OFF_VALUES[name]
    return value is None or (value == off and isinstance(value, bool) == isinstance(off, bool))


def check_fields(body: dict[str, Any], kind: Kind) -> None:
    for name, value in body.items():
        if name in OFF_VALUES:
            if not _is_off(name, value):
                raise bad(name, f"only {OFF_VALUES[name]!r} is supported by this server")
        elif name not in FIELDS[kind]:
            raise bad(name, "is not supported by this server")


def _number(body: dict[str, Any], name: str, low: float, high: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise bad(name, "must be a number")
    if not low <= value <= high:
        raise bad(name, f"must be between {low} and {high}")
    return float(value)


def _int(body: dict[str, Any], name: str, low: int | None = None, high: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad(name, "must be an integer")
    if (low is not None and value < low) or (high is not None and value > high):
        raise bad(
            name, f"must be between {low} and {high}" if high is not None else f"must be at least {low}"
        )
    return value


def _bool(body: dict[str, Any], name: str, where: str = "") -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise bad(where + name, "must be a boolean")
    return value


def _stop(body: dict[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop) or len(stop) > 4:
        raise bad("stop", "must be a non-empty string or a list of up to 4 of them")
    return tuple(stop)


def _stop_token_ids(body: dict[str, Any]) -> tuple[int, ...]:
    ids = body.get("stop_token_ids")
    if ids is None:
        return ()
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise bad("stop_token_ids", "must be a list of token ids")
    return tuple(ids)


def _top_k(body: dict[str, Any]) -> int | None:
    top_k = _int(body, "top_k", -1)
    return None if top_k is None else max(top_k, 0)  # -1 and 0 both mean every token, as in vLLM


def _include_usage(body: dict[str, Any], stream: bool) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not stream:
        raise bad("stream_options", "is only allowed with stream: true")
    if not isinstance(options, dict):
        raise bad("stream_options", "must be an object")
    for key in options:
        if key != "include_usage":
            raise bad(f"stream_options.{key}", "is not supported (only include_usage)")
    return _bool(options, "include_usage", "stream_options.")


def _logprobs(body: dict[str, Any], kind: Kind) -> int | None:
    """Completions: ``logprobs`` is how many alternatives; chat: a flag plus ``top_logprobs``."""
    if kind == "completion":
        return _int(body, "logprobs", 0, MAX_LOGPROBS)
    top = _int(body, "top_logprobs", 0, MAX_LOGPROBS)
    if not _bool(body, "logprobs"):
        if top:
            raise bad("top_logprobs", "needs logprobs: true")
        return None
    return top or 0


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
        raise bad("prompt", "is required")
    raise bad("prompt", "must be a non-empty string or a list of token ids (one prompt per request)")


def _model(body: dict[str, Any], served_model: str) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad("model", "is required and must be a string")
    if model != served_model:
        raise ApiError(
            404,
            f"model: {model!r} does not exist; this worker serves {served_model!r}",
            "model",
            "not_found_error",
        )
    return model


def _max_tokens(body: dict[str, Any]) -> int | None:
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _int(body, name)
    if max_tokens is not None and max_tokens < 1:
        raise bad(name, "must be at least 1")
    return max_tokens


def _user(body: dict[str, Any]) -> str | None:
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise bad("user", "must be a string")
    return user


def parse_request(
    body: Any,
    kind: Kind,
    served_model: str,
    chat_template: ChatTemplate | None = None,
    request_id: str | None = None,
) -> ApiRequest:
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object")
    model = _model(body, served_model)
    check_fields(body, kind)
    stream = _bool(body, "stream")
    prompt = render_chat(body.get("messages"), chat_template) if kind == "chat" else _prompt(body)
    return ApiRequest(
        kind=kind,
        model=model,
        prompt=prompt,
        max_tokens=_max_tokens(body),
        temperature=_number(body, "temperature", 0.0, 2.0),
        top_p=_number(body, "top_p", 1e-6, 1.0),
        top_k=_top_k(body),
        stream=stream,
        stop=_stop(body),
        stop_token_ids=_stop_token_ids(body),
        priority=_int(body, "priority"),
        seed=_int(body, "seed"),
        ignore_eos=_bool(body, "ignore_eos"),
        logprobs=_logprobs(body, kind),
        # A rendered template already holds the model's special tokens (BOS and turn markers).
        templated=kind == "chat" and chat_template is not None,
        include_usage=_include_usage(body, stream),
        user=_user(body),
        request_id=request_id or new_request_id(),
    )
