"""Chat prompts in the model's own format.

A chat model was trained on one exact layout of roles and special tokens; the Hugging Face
convention ships it as a Jinja template, in ``chat_template.jinja`` (newer checkpoints; it wins,
as in transformers) or as ``chat_template`` in ``tokenizer_config.json``. We render it the way
``transformers``' ``apply_chat_template`` does: the same sandboxed environment (trim_blocks,
lstrip_blocks, loop controls, a ``{% generation %}`` tag), the same helpers (a ``tojson`` that
does not HTML-escape, ``raise_exception``, ``strftime_now``, ``dict``, a ``namespace`` that
refuses dunder names) and the same variables (``messages``, ``tools``, ``documents``,
``add_generation_prompt`` and the special tokens). Models without a template (the seeded test
models) get a plain role-tagged transcript. Torch-free: the router renders prompts with it too.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.sandbox
import jinja2.utils

Message = dict[str, Any]
TEMPLATE_FILE = "chat_template.jinja"
TOKENIZER_CONFIG = "tokenizer_config.json"
SPECIAL_TOKEN_KEYS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "pad_token",
    "sep_token",
    "cls_token",
    "mask_token",
)


class ChatTemplateError(ValueError):
    """The messages cannot be rendered; the template's own words say why (e.g. role order)."""


@dataclass(frozen=True)
class ChatTemplate:
    template: jinja2.Template
    special_tokens: dict[str, str] = field(default_factory=dict)  # bos_token -> "<s>", ...

    def render(self, messages: Sequence[Message]) -> str:
        try:
            return self.template.render(
                messages=[dict(m) for m in messages],
                tools=None,
                documents=None,
                add_generation_prompt=True,
                **self.special_tokens,
            )
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(str(exc)) from exc


def plain_transcript(messages: Sequence[Message]) -> str:
    """For models without a template: each turn tagged with its role, then the assistant's."""
    return "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages) + "<|assistant|>\n"


def load_chat_template(model_dir: str | Path) -> ChatTemplate | None:
    """The model's template, or None when it has none."""
    directory = Path(model_dir)
    config = _tokenizer_config(directory / TOKENIZER_CONFIG)
    jinja_file = directory / TEMPLATE_FILE
    if jinja_file.is_file():
        source: str | None = jinja_file.read_text(encoding="utf-8")
        where = jinja_file
    else:
        source, where = _template_source(config.get("chat_template")), directory / TOKENIZER_CONFIG
    if source is None:
        return None
    try:
        template = _environment().from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise ValueError(f"model.path: chat_template in {where} does not compile: {exc}") from exc
    specials = {k: text for k in SPECIAL_TOKEN_KEYS if (text := _token_text(config.get(k))) is not None}
    return ChatTemplate(template, specials)


def _tokenizer_config(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"model.path: {path} is not valid JSON: {exc}") from exc
    return config if isinstance(config, dict) else {}


def _template_source(value: Any) -> str | None:
    """A string, or (some checkpoints) a list of named templates of which we take ``default``."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        default = named.get("default")
        return default if isinstance(default, str) else None
    return None


def _token_text(value: Any) -> str | None:
    """Special tokens appear as plain strings or as AddedToken dicts with a ``content``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` marks assistant text for training masks;
    rendering a prompt only needs its body."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return str(caller())


class _Namespace(jinja2.utils.Namespace):
    """Jinja's ``namespace``, refusing underscore names (no reach into Python internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)


def _check_name(name: Any) -> None:
    if isinstance(name, str) and name.startswith("_"):
        raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r} is not allowed")


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    """JSON as the model saw it in training: Jinja's own filter would HTML-escape < > & '."""
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _environment() -> jinja2.sandbox.ImmutableSandboxedEnvironment:
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)  # Llama 3.1 templates
    env.globals["dict"] = lambda *args, **kwargs: dict(*args, **kwargs)
    env.globals["namespace"] = _Namespace
    return env


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)
