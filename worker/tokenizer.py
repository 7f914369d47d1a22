"""Text <-> token ids: the model directory's tokenizer.json when present, else UTF-8 bytes.

The byte-level fallback needs no files, so the deterministic test models work offline; its ids
0-255 are bytes and the few ids above them are special tokens.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

BYTE_BOS_ID = 256
BYTE_EOS_ID = 257
BYTE_VOCAB_SIZE = 320  # 256 bytes, BOS, EOS, room for more specials; a multiple of 64


class Tokenizer(Protocol):
    eos_token_id: int | None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, token_ids: list[int]) -> str: ...


class ByteTokenizer:
    eos_token_id: int | None = BYTE_EOS_ID

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, token_ids: list[int]) -> str:
        return bytes(t for t in token_ids if 0 <= t < 256).decode("utf-8", errors="replace")


class HFTokenizer:
    """A ``tokenizers`` tokenizer.json (its post-processor adds BOS where the model wants it)."""

    def __init__(self, path: Path, eos_token_id: int | None) -> None:
        from tokenizers import Tokenizer as RustTokenizer

        self._tok = RustTokenizer.from_file(str(path))
        self.eos_token_id = eos_token_id

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """``add_special_tokens=False`` for text that already holds them (a rendered chat
        template), as transformers does, so BOS is not doubled."""
        ids: list[int] = self._tok.encode(text, add_special_tokens=add_special_tokens).ids
        return ids

    def decode(self, token_ids: list[int]) -> str:
        text: str = self._tok.decode(token_ids, skip_special_tokens=True)
        return text


def load_tokenizer(model_dir: str | Path, eos_token_id: int | None) -> Tokenizer:
    path = Path(model_dir) / "tokenizer.json"
    if not path.is_file():
        return ByteTokenizer()
    # A model that ships a tokenizer must get it: bytes would be valid ids with the wrong meaning.
    from strata.worker.models.loader import ModelLoadError

    try:
        return HFTokenizer(path, eos_token_id)
    except Exception as exc:
        raise ModelLoadError(f"model.path: cannot load {path}: {exc}") from exc
