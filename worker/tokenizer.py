"""Text <-> token ids: the model directory's tokenizer.json when present, else UTF-8 bytes.

The byte-level fallback needs no files, so the deterministic test models work offline; its ids
0-255 are bytes and the few ids above them are special tokens. Torch-free: the router validates
requests with it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

BYTE_BOS_ID = 256
BYTE_EOS_ID = 257
BYTE_VOCAB_SIZE = 320  # 256 bytes, BOS, EOS, room for more specials; a multiple of 64


class Tokenizer(Protocol):
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, token_ids: list[int]) -> str: ...

    def token_bytes(self, token_id: int) -> bytes:
        """One token's own bytes (special tokens included), for logprobs."""
        ...

    def special_tokens(self) -> dict[str, int]:
        """Special token text -> id (how end-of-turn markers are found)."""
        ...

    def token_id(self, text: str) -> int | None:
        """The id of the token spelled ``text`` (special or not), if the vocabulary has one."""
        ...


class ByteTokenizer:
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, token_ids: list[int]) -> str:
        return bytes(t for t in token_ids if 0 <= t < 256).decode("utf-8", errors="replace")

    def token_bytes(self, token_id: int) -> bytes:
        return bytes([token_id]) if 0 <= token_id < 256 else b""

    def special_tokens(self) -> dict[str, int]:
        return {}

    def token_id(self, text: str) -> int | None:
        del text
        return None


class HFTokenizer:
    """A ``tokenizers`` tokenizer.json (its post-processor adds BOS where the model wants it)."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer as RustTokenizer

        self._tok = RustTokenizer.from_file(str(path))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """``add_special_tokens=False`` for text that already holds them (a rendered chat
        template), as transformers does, so BOS is not doubled."""
        ids: list[int] = self._tok.encode(text, add_special_tokens=add_special_tokens).ids
        return ids

    def decode(self, token_ids: list[int]) -> str:
        text: str = self._tok.decode(token_ids, skip_special_tokens=True)
        return text

    def token_bytes(self, token_id: int) -> bytes:
        text: str = self._tok.decode([token_id], skip_special_tokens=False)
        return text.encode("utf-8")

    def special_tokens(self) -> dict[str, int]:
        added = self._tok.get_added_tokens_decoder()
        return {token.content: token_id for token_id, token in added.items() if token.special}

    def token_id(self, text: str) -> int | None:
        found: int | None = self._tok.token_to_id(text)
        return found


def load_tokenizer(model_dir: str | Path) -> Tokenizer:
    path = Path(model_dir) / "tokenizer.json"
    if not path.is_file():
        return ByteTokenizer()
    # A model that ships a tokenizer must get it: bytes would be valid ids with the wrong meaning.
    from strata.worker.models.errors import ModelLoadError

    try:
        return HFTokenizer(path)
    except Exception as exc:
        raise ModelLoadError(f"model.path: cannot load {path}: {exc}") from exc
