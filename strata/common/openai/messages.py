"""Chat messages in, one prompt string out: the checks clients rely on, then the template.

What SDKs and UIs actually send: ``content`` as a string or as a list of parts (text parts are
joined with newlines, as vLLM does; image/audio/file parts are refused naming the part), the
``developer`` role (OpenAI's newer name for ``system``, rendered as ``system`` since templates
know that one), and ``content: null`` on an assistant turn. Keys the worker would ignore (tool
calls, audio) are refused naming the key; a key sent as ``null`` or ``[]`` counts as absent, so a
client that sends back the assistant message it received is not refused. Torch-free.
"""

from __future__ import annotations

from typing import Any

from strata.common.openai.chat_template import ChatTemplate, ChatTemplateError, Message, plain_transcript
from strata.common.openai.errors import bad

ROLES = ("system", "developer", "user", "assistant", "tool")
MESSAGE_KEYS = ("role", "content", "name", "tool_call_id")


def _parts_text(parts: list[Any], where: str) -> str:
    texts: list[str] = []
    for j, part in enumerate(parts):
        if not isinstance(part, dict):
            raise bad(f"{where}[{j}]", "must be an object with a type")
        if part.get("type") != "text":
            raise bad(f"{where}[{j}].type", f"{part.get('type')!r} parts are not supported (text only)")
        if not isinstance(part.get("text"), str):
            raise bad(f"{where}[{j}].text", "must be a string")
        texts.append(part["text"])
    return "\n".join(texts)


def _content(msg: dict[str, Any], where: str) -> str:
    content = msg.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return _parts_text(content, f"{where}.content")
    if content is None and msg["role"] == "assistant":
        return ""  # an assistant turn that only called tools, sent back by the client
    raise bad(f"{where}.content", "must be a string or a list of text parts")


def _message(msg: Any, i: int) -> Message:
    where = f"messages[{i}]"
    if not isinstance(msg, dict) or msg.get("role") not in ROLES:
        raise bad(f"{where}.role", f"must be one of {', '.join(ROLES)}")
    for key, value in msg.items():
        if key not in MESSAGE_KEYS and value not in (None, []):
            raise bad(f"{where}.{key}", "is not supported by this server")
    role = "system" if msg["role"] == "developer" else msg["role"]
    checked: Message = {"role": role, "content": _content(msg, where)}
    for key in ("name", "tool_call_id"):
        if msg.get(key) is not None:
            if not isinstance(msg[key], str):
                raise bad(f"{where}.{key}", "must be a string")
            checked[key] = msg[key]
    return checked


def chat_messages(messages: Any) -> list[Message]:
    """The request's messages, checked and normalised for the template."""
    if not isinstance(messages, list) or not messages:
        raise bad("messages", "must be a non-empty list")
    return [_message(msg, i) for i, msg in enumerate(messages)]


def render_chat(messages: Any, template: ChatTemplate | None) -> str:
    """The prompt in the model's chat format, or a plain transcript for models without one."""
    checked = chat_messages(messages)
    if template is None:
        return plain_transcript(checked)
    try:
        return template.render(checked)
    except ChatTemplateError as exc:
        raise bad("messages", f"the model's chat template refused them: {exc}") from exc
