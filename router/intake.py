"""A request at the door: validated, tokenized and hashed exactly as the worker would.

The same pure pieces as the worker's do the work (``strata.common.openai``'s parse_request and
chat template, the worker's tokenizer, ``request_limits``, ``kv_connector.chain_hashes``), so a
bad request gets the worker's error from the router without touching a worker, and the block
hashes are the ones the workers report in their block events. A vLLM engine validates its own
requests (it takes far more than Strata's worker does): for it the router reads only what
routing needs (``engine_request``), hashes from the vLLM root (``vllm.keys``) with the request's
``cache_salt``, and gives every request the service's cache namespace as its salt where it has
none, so vLLM's own block hashes are tenant-salted too.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from strata.common.openai.chat_template import ChatTemplate, load_chat_template
from strata.common.openai.messages import render_chat
from strata.common.openai.protocol import ApiError, ApiRequest, Kind, parse_request
from strata.common.openai.request_id import new_request_id
from strata.router.choose import Prompt
from strata.router.config import PriorityConfig, RouterConfig
from strata.worker import request_limits
from strata.worker.kv_connector import chain_hashes, root_hash
from strata.worker.models.generation import GenerationDefaults, load_generation_defaults
from strata.worker.tokenizer import ByteTokenizer, Tokenizer, load_tokenizer
from strata.worker.vllm.keys import vllm_root

MAX_HEADER_BYTES = 8190  # aiohttp's default field limit, as the workers have it
PASSED_ON = ("Authorization",)  # the caller's API key, for workers that require one


@dataclass(frozen=True)
class Admitted:
    """A request worth forwarding: the body to send, and what routing needs to know of it."""

    api: ApiRequest
    body: bytes
    prompt: Prompt
    priority: int
    request_id: str
    passed_on: dict[str, str]  # caller headers the worker must see too (its API key)


class Intake:
    def __init__(self, config: RouterConfig) -> None:
        self.config = config
        model = config.model
        self.tokenizer: Tokenizer = load_tokenizer(model.path) if model.path else ByteTokenizer()
        self.template: ChatTemplate | None = load_chat_template(model.path) if model.path else None
        self.generation = (
            load_generation_defaults(model.path, self.tokenizer) if model.path else GenerationDefaults()
        )
        self.root = root_hash(config.cache_namespace, model.name, config.block_size)
        self.vllm = config.workers.engine == "vllm"

    def admit(self, raw: bytes, kind: Kind, headers: Mapping[str, str], rid: str) -> Admitted:
        """Raise the worker's :class:`ApiError` for a request no worker would serve. ``rid`` is
        the request's id (``strata.common.openai.request_id``), forwarded as ``X-Request-Id``."""
        check_headers(headers)
        body = _json(raw)
        if self.vllm:
            api = engine_request(body, kind, self.config.model.name, self.template, rid)
        else:
            api = parse_request(body, kind, self.config.model.name, self.template, rid)
        token_ids = self._tokens(api)
        if not self.vllm:
            self._check(api, token_ids)
        priority = resolve_priority(self.config.priority, headers, api.priority)
        changes = self._changes(body, api, priority)
        if changes:
            body = {**body, **changes}
            raw = json.dumps(body).encode()
        blocks = chain_hashes(self._root(body), token_ids, self.config.block_size)
        prompt = Prompt(blocks, len(token_ids), self.config.block_size)
        passed_on = {h: headers[h] for h in PASSED_ON if h in headers}
        return Admitted(api, raw, prompt, priority, rid, passed_on)

    def _changes(self, body: dict[str, Any], api: ApiRequest, priority: int) -> dict[str, Any]:
        changes: dict[str, Any] = {"priority": priority} if priority != api.priority else {}
        if self.vllm and not body.get("cache_salt"):
            changes["cache_salt"] = self.config.cache_namespace
        return changes

    def _root(self, body: dict[str, Any]) -> bytes:
        if not self.vllm:
            return self.root
        config, salt = self.config, body.get("cache_salt")
        salt = salt if isinstance(salt, str) else None
        return vllm_root(
            config.cache_namespace, config.model.name, config.block_size, config.workers.device, salt=salt
        )

    def _check(self, api: ApiRequest, token_ids: list[int]) -> None:
        """The engine's own checks, with the ``max_tokens`` the worker would give the request."""
        model = self.config.model
        room = model.max_context_tokens - len(token_ids)
        max_tokens = request_limits.max_tokens(api.kind, api.max_tokens, self.generation.max_tokens, room)
        try:
            request_limits.check(token_ids, max_tokens, model.max_context_tokens, model.vocab_size)
        except request_limits.RequestError as exc:
            raise ApiError(400, str(exc), exc.field) from exc

    def _tokens(self, api: ApiRequest) -> list[int]:
        if isinstance(api.prompt, str):
            return self.tokenizer.encode(api.prompt, add_special_tokens=not api.templated)
        return list(api.prompt)


def engine_request(
    body: Any, kind: Kind, served_model: str, template: ChatTemplate | None, rid: str
) -> ApiRequest:
    """What routing needs of a request to an engine that validates its own: the model (a wrong
    one gets the 404 here), the prompt as the engine will see it (empty where the router cannot
    render it, e.g. images: routed on load alone), streaming and priority. Nothing else is
    checked or refused: the engine answers for its own fields."""
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object")
    model = body.get("model")
    if model != served_model:
        parse_request({"model": model}, kind, served_model)  # the worker's error for it
    stream = body.get("stream") is True
    priority = body.get("priority")
    return ApiRequest(
        kind=kind, model=served_model, prompt=_engine_prompt(body, kind, template), max_tokens=None,
        temperature=None, top_p=None, top_k=None, stream=stream, stop=(), stop_token_ids=(),
        priority=priority if isinstance(priority, int) and not isinstance(priority, bool) else None,
        seed=None, ignore_eos=False, templated=kind == "chat" and template is not None,
        include_usage=stream and (body.get("stream_options") or {}).get("include_usage") is True,
        request_id=rid or new_request_id(),
    )  # fmt: skip


def _engine_prompt(body: dict[str, Any], kind: Kind, template: ChatTemplate | None) -> str | list[int]:
    try:
        if kind == "chat":
            return render_chat(body.get("messages"), template)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
            prompt = prompt[0]
        if isinstance(prompt, str) or (isinstance(prompt, list) and all(type(t) is int for t in prompt)):
            return prompt
    except ApiError:
        pass
    return []


def _json(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"request body is not valid JSON: {exc}") from exc


def check_headers(headers: Mapping[str, str]) -> None:
    for name, value in headers.items():
        if len(name) + len(value) > MAX_HEADER_BYTES:
            raise ApiError(431, f"{name}: header larger than {MAX_HEADER_BYTES} bytes", name)


def resolve_priority(config: PriorityConfig, headers: Mapping[str, str], asked: int | None) -> int:
    """The header's priority, else the body's ``priority``, else the tier's; within the tier's
    bounds or a 400 naming where it came from."""
    raw = headers.get(config.header)
    if raw is not None:
        try:
            value = int(raw.strip())
        except ValueError:
            raise ApiError(
                400, f"{config.header}: must be an integer, got {raw[:40]!r}", config.header
            ) from None
        return _bounded(config, value, config.header)
    if asked is not None:
        return _bounded(config, asked, "priority")
    return config.default


def _bounded(config: PriorityConfig, value: int, where: str) -> int:
    if not config.min <= value <= config.max:
        raise ApiError(
            400, f"{where}: must be between {config.min} and {config.max} for this service's tier", where
        )
    return value
