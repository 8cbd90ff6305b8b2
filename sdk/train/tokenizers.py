"""Tokenizers the trainer adapter works with: one protocol, a character one built in code.

The adapter only needs `encode(text) -> ids` and `decode(ids) -> text`; a Hugging Face
tokenizer fits through `HFTokenizer`. `CharTokenizer` is the one the CPU demo and the
learning test use: one id per character of a given alphabet, plus BOS.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Tokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class CharTokenizer:
    """One token per character of `alphabet`; id 0 is BOS. Unknown characters are an error
    (a silent UNK would let an environment turn change meaning)."""

    BOS = 0

    def __init__(self, alphabet: str) -> None:
        if len(set(alphabet)) != len(alphabet):
            raise ValueError("the alphabet repeats a character")
        self.alphabet = alphabet
        self._ids = {c: i + 1 for i, c in enumerate(alphabet)}

    @property
    def vocab_size(self) -> int:
        return len(self.alphabet) + 1

    def encode(self, text: str) -> list[int]:
        try:
            return [self._ids[c] for c in text]
        except KeyError as exc:
            raise ValueError(f"character {exc.args[0]!r} is not in {self.alphabet!r}") from None

    def decode(self, ids: list[int]) -> str:
        return "".join(self.alphabet[i - 1] if 0 < i <= len(self.alphabet) else "" for i in ids)


class HFTokenizer:
    """A Hugging Face tokenizer as a `Tokenizer`: no special tokens added on encode."""

    def __init__(self, tokenizer: Any) -> None:
        self.inner = tokenizer

    def encode(self, text: str) -> list[int]:
        return list(self.inner.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        return str(self.inner.decode(ids, skip_special_tokens=False))
