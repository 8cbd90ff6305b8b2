"""What a reader's eye makes of a text, for finding judge fence markers in it.

Every character is folded to what it can be read as: a character that any of its case
mappings (`upper`, `lower`, `casefold`) or compatibility forms (NFKC, NFKD), with combining
marks stripped, spells with ASCII letters or angle brackets folds to those (dotless ı, long
ſ, Kelvin K, Angstrom Å, Turkish İ, ligatures, fullwidth and mathematical letters, ǅ);
other letters fold to their NFKC casefold, angle-bracket look-alikes to brackets, and
invisible format characters and combining marks to nothing. The table is built once, on
first use, over every code point (about 0.5 s); folding a text is then one `str.translate`.
"""

from __future__ import annotations

import functools
import re
import sys
import unicodedata

# what a reader takes for angle brackets, folded to the ones it looks like
LOOKALIKES = {
    "\u2039": "<", "\u3008": "<", "\u27e8": "<", "\u276e": "<", "\u2770": "<", "\u02c2": "<",
    "\u1438": "<", "\u00ab": "<<", "\u300a": "<<", "\u27ea": "<<", "\u226a": "<<",
    "\u22d8": "<<<", "\u203a": ">", "\u3009": ">", "\u27e9": ">", "\u276f": ">",
    "\u2771": ">", "\u02c3": ">", "\u1433": ">", "\u00bb": ">>", "\u300b": ">>",
    "\u27eb": ">>", "\u226b": ">>", "\u22d9": ">>>",
}  # fmt: skip
_LOOKALIKE_TABLE = str.maketrans(LOOKALIKES)
# what a marker is made of: ASCII letters (folded to lower case) and angle brackets
_MARKER_CHARS = re.compile(r"[a-z<>]")
_DROPPED = ("Cf", "Mn", "Me")  # invisible, or a mark on the letter before
_NO_FORM = ("Cn", "Cs", "Co")  # unassigned, surrogates, private use


def _bare(text: str) -> str:
    """`text` decomposed (NFKD) with combining marks and format characters dropped."""
    cat = unicodedata.category
    return "".join(c for c in unicodedata.normalize("NFKD", text) if cat(c) not in _DROPPED)


def readings(ch: str) -> set[str]:
    """The marker characters (ASCII letters in lower case, angle brackets) `ch` spells in
    each of its case mappings and compatibility forms, marks stripped; empty: none."""
    texts: set[str] = set()
    for form in {ch, ch.lower(), ch.upper(), ch.casefold()}:
        for norm in {unicodedata.normalize("NFKC", form), unicodedata.normalize("NFKD", form)}:
            texts.update((norm, norm.lower(), norm.upper(), norm.casefold()))
    found = {"".join(_MARKER_CHARS.findall(_bare(t).lower())) for t in texts}
    found.discard("")
    return found


def _fold_of(ch: str) -> str:
    """What `ch` (not ASCII) folds to; see the module doc."""
    if ch in LOOKALIKES:
        return LOOKALIKES[ch]
    if unicodedata.category(ch) in _DROPPED:
        return ""
    if ch.lower() == ch.upper() == ch.casefold() == ch == unicodedata.normalize("NFKD", ch):
        return ch  # no case and no compatibility form: read as itself
    spelled = readings(ch)
    if spelled:
        # one reading per character in Unicode 14 (tests/redteam/test_judge_redteam.py
        # checks it over every code point); the longest, should a later version add more
        return max(sorted(spelled), key=len)
    return unicodedata.normalize("NFKC", ch).casefold().translate(_LOOKALIKE_TABLE)


@functools.cache
def fold_table() -> dict[int, str]:
    """`str.translate`'s table: every code point whose fold is not itself."""
    table = {ord(c): c.lower() for c in map(chr, range(ord("A"), ord("Z") + 1))}
    category = unicodedata.category
    for cp in range(0x80, sys.maxunicode + 1):
        ch = chr(cp)
        if category(ch) in _NO_FORM:
            continue
        f = _fold_of(ch)
        if f != ch:
            table[cp] = f
    return table


def fold(text: str) -> str:
    """`text` as a reader's eye takes it (see the module doc)."""
    if text.isascii():
        return text.lower()
    return text.translate(fold_table())


def fold_index(text: str) -> list[int]:
    """For each character of `fold(text)`, the index in `text` it comes from."""
    table = fold_table()
    where: list[int] = []
    for i, ch in enumerate(text):
        n = len(table.get(ord(ch), ch))
        if n == 1:
            where.append(i)
        elif n:
            where.extend([i] * n)
    return where
