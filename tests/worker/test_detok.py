"""Streaming detokenization: stop strings and partial characters are never emitted early."""

from __future__ import annotations

from strata.worker.server.detok import Detokenizer, held_back
from strata.worker.tokenizer import ByteTokenizer


def feed_all(detok: Detokenizer, text: bytes, step: int = 1) -> list[str]:
    return [detok.feed(list(text[i : i + step])) for i in range(0, len(text), step)]


def test_held_back_is_the_longest_tail_starting_a_stop() -> None:
    assert held_back("hello wor", ("world",)) == 3
    assert held_back("hello", ("xyz",)) == 0
    assert held_back("ab", ("abc", "b!")) == 2


def test_text_is_cut_at_the_stop_string() -> None:
    detok = Detokenizer(ByteTokenizer(), ("END",))
    pieces = feed_all(detok, b"one two EN")
    assert "".join(pieces) == "one two "  # "EN" held back: it may become "END"
    assert detok.feed(list(b"D and more")) == ""
    assert detok.stopped and detok.text == "one two "


def test_a_false_alarm_is_released() -> None:
    detok = Detokenizer(ByteTokenizer(), ("END",))
    feed_all(detok, b"the EN")
    assert detok.feed(list(b"x")) == "ENx"
    assert not detok.stopped


def test_multibyte_characters_are_emitted_whole() -> None:
    detok = Detokenizer(ByteTokenizer())
    pieces = feed_all(detok, "héllo €".encode())
    assert "\ufffd" not in "".join(pieces)
    assert "".join(pieces) == "héllo €"


def test_final_feed_flushes_everything() -> None:
    detok = Detokenizer(ByteTokenizer(), ("END",))
    feed_all(detok, b"abc E")
    assert detok.feed([], final=True) == "E"
