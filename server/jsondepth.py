"""How deeply a JSON text nests and how many values it holds, without parsing it
(server/guards.py refuses past its limits, before a parser spends time or memory on it).

A batch body is scanned on every call, and most of its bytes are string contents (a file, a
patch, a model's answer), so the scan looks at the few bytes that matter: it finds the
brackets, quotes and backslashes in one vectorized pass, then works on those alone. A 4 MB
body of long strings costs a few milliseconds; scanning every byte cost a hundred times
that, long enough to stall every tenant's step on the event loop.
"""

from __future__ import annotations

import numpy as np

_OPEN, _CLOSE = (ord("["), ord("{")), (ord("]"), ord("}"))
_QUOTE, _BACKSLASH, _COMMA = ord('"'), ord("\\"), ord(",")
_MATTERS = np.zeros(256, dtype=bool)
_MATTERS[[*_OPEN, *_CLOSE, _QUOTE, _BACKSLASH, _COMMA]] = True
_NOISE = bytes(b for b in range(256) if not _MATTERS[b])  # what bytes.translate drops
_DELTA = np.zeros(256, dtype=np.int64)
_DELTA[list(_OPEN)] = 1
_DELTA[list(_CLOSE)] = -1


# The plain path (bodies of few brackets: a batch of actions) works on the text outside
# strings with bytes operations, in C: at most PLAIN_PASSES nesting levels of at most
# PLAIN_BYTES brackets, else (deep, large or unbalanced) the vectorized scan answers.
_PARENS = bytes.maketrans(b"[{]}", b"(())")
PLAIN_BYTES = 8192
PLAIN_PASSES = 16


def json_depth(raw: bytes) -> int:
    """The deepest nesting of the JSON text `raw` (brackets inside strings do not count)."""
    return json_shape(raw)[0]


def json_shape(raw: bytes) -> tuple[int, int]:
    """(deepest nesting, about how many values) of the JSON text `raw`: the values counted
    are the containers and the elements their commas separate (one more per non-empty
    container, at most), what a parser would make objects of. Brackets and commas inside
    strings do not count.

    A quote opens or closes a string unless an odd run of backslashes ends right before it;
    brackets and commas between an opening and a closing quote are text."""
    opens = raw.count(b"[") + raw.count(b"{")
    if opens == 0:
        return 0, 1
    if 2 * opens <= PLAIN_BYTES:
        plain = shape_by_passes(raw)
        if plain is not None:
            return plain
    return shape_by_scan(raw)


def shape_by_scan(raw: bytes) -> tuple[int, int]:
    """`json_shape` by one vectorized pass over the bytes that matter (any text)."""
    at = None
    if b"\\" in raw:
        data = np.frombuffer(raw, dtype=np.uint8)
        at = np.flatnonzero(_MATTERS[data])  # where the bytes that matter are
        chars = data[at]
    else:  # no escapes (most bodies): only the order of the bytes that matter counts,
        # not where they are, and one C pass (bytes.translate) keeps them
        chars = np.frombuffer(raw.translate(None, _NOISE), dtype=np.uint8)
    delta = _DELTA[chars]
    quotes = chars == _QUOTE
    if quotes.any():
        slashes = chars == _BACKSLASH
        if at is not None and slashes.any():
            # A backslash continues a run when the byte right before it is one too.
            follows = np.zeros(len(at), dtype=bool)
            follows[1:] = (at[1:] - at[:-1]) == 1
            continues = np.zeros(len(at), dtype=bool)
            continues[1:] = slashes[1:] & slashes[:-1] & follows[1:]
            count = np.cumsum(slashes, dtype=np.int64)
            before_run = np.maximum.accumulate(np.where(slashes & ~continues, count - 1, 0))
            run = count - before_run  # at a backslash: the length of its run up to it
            escaped = np.zeros(len(at), dtype=bool)
            escaped[1:] = quotes[1:] & follows[1:] & slashes[:-1] & ((run[:-1] & 1) == 1)
            quotes &= ~escaped
        inside = (np.cumsum(quotes, dtype=np.int64) & 1).astype(bool)
        delta = np.where(inside, 0, delta)
        separators = (chars == _COMMA) & ~inside
    else:
        separators = chars == _COMMA
    depth = int(np.cumsum(delta, dtype=np.int64).max(initial=0))
    opened = int(np.count_nonzero(delta > 0))
    return depth, 2 * opened + int(np.count_nonzero(separators))


def shape_by_passes(raw: bytes) -> tuple[int, int] | None:
    """`json_shape` of a text of few brackets, or None where the vectorized scan must answer.

    Escapes first: in a run of backslashes each pair is one escaped backslash (dropped), and
    a backslash left before a quote escapes it (dropped with it), so every quote left opens
    or closes a string and the text outside strings is every other piece between quotes.
    Its brackets, all read as one kind (as the scan counts them), nest as deep as the passes
    that strip adjacent `()` pairs until none are left: each pass takes every innermost
    pair, one level."""
    if b"\\" in raw:
        raw = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    # A pair of adjacent quotes has nothing between them: dropping it leaves every other
    # byte inside or outside a string as it was (and most strings hold no bracket).
    kept = raw.translate(None, _NOISE).replace(b'""', b"")
    outside = b"".join(kept.split(b'"')[::2]) if b'"' in kept else kept
    separators = outside.count(b",")
    parens = outside.translate(_PARENS, b",\\")
    if len(parens) > PLAIN_BYTES:
        return None
    opened = parens.count(b"(")
    depth = 0
    while parens:
        if depth == PLAIN_PASSES:
            return None
        stripped = parens.replace(b"()", b"")
        if len(stripped) == len(parens):
            return None  # unbalanced: the scan finds how deep its prefix reaches
        parens = stripped
        depth += 1
    return depth, 2 * opened + separators
