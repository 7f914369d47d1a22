"""Chat prompts in the model's own format.

A chat model was trained on one exact layout of roles and special tokens; the Hugging Face
convention ships it as a Jinja ``chat_template`` in ``tokenizer_config.json``. We render it the
way ``transformers``' ``apply_chat_template`` does (sandboxed Jinja, trim_blocks, lstrip_blocks,
``add_generation_prompt``), so a real checkpoint gets the prompt it expects. Models without a
template (the seeded test models) get a plain role-tagged transcript.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.sandbox

Message = dict[str, str]


class ChatTemplateError(ValueError):
    """The messages cannot be rendered; the template's own words say why (e.g. role order)."""


@dataclass(frozen=True)
class ChatTemplate:
    template: jinja2.Template
    bos_token: str
    eos_token: str

    def render(self, messages: Sequence[Message]) -> str:
        try:
            return self.template.render(
                messages=list(messages),
                add_generation_prompt=True,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(str(exc)) from exc


def plain_transcript(messages: Sequence[Message]) -> str:
    """For models without a template: each turn tagged with its role, then the assistant's."""
    return "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages) + "<|assistant|>\n"


def load_chat_template(model_dir: str | Path) -> ChatTemplate | None:
    """The template of ``tokenizer_config.json``, or None when the model has none."""
    path = Path(model_dir) / "tokenizer_config.json"
    if not path.is_file():
        return None
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"model.path: {path} is not valid JSON: {exc}") from exc
    source = _template_source(config.get("chat_template"))
    if source is None:
        return None
    try:
        template = _environment().from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise ValueError(f"model.path: chat_template in {path} does not compile: {exc}") from exc
    return ChatTemplate(template, _token_text(config.get("bos_token")), _token_text(config.get("eos_token")))


def _template_source(value: Any) -> str | None:
    """A string, or (newer checkpoints) a list of named templates of which we take ``default``."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        default = named.get("default")
        return default if isinstance(default, str) else None
    return None


def _token_text(value: Any) -> str:
    """Special tokens appear as plain strings or as AddedToken dicts with a ``content``."""
    if isinstance(value, dict):
        return str(value.get("content", ""))
    return value if isinstance(value, str) else ""


def _environment() -> jinja2.sandbox.ImmutableSandboxedEnvironment:
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)  # Llama 3.1 templates
    return env


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)
