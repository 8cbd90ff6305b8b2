"""Greedy word wrapping.

wrap(text, width) returns a list of lines:
- paragraphs are separated by one or more blank lines in `text`; in the output, paragraphs are
  separated by exactly one empty string "";
- inside a paragraph, words (runs of non-whitespace) are joined by single spaces, and each
  line takes as many words as fit: a line's length may be anything up to and including
  `width`;
- a word longer than `width` is cut into pieces of exactly `width` characters (the last piece
  may be shorter), each piece placed as a word of its own;
- width < 1 raises ValueError; empty or blank text gives [].
"""


def _paragraphs(text):
    paras, current = [], []
    for line in text.splitlines():
        if line.strip():
            current.extend(line.split())
        elif current:
            paras.append(current)
            current = []
    if current:
        paras.append(current)
    return paras


def wrap(text: str, width: int) -> list:
    if width < 1:
        raise ValueError("width must be at least 1")
    out = []
    for words in _paragraphs(text):
        if out:
            out.append("")
        line = ""
        for word in words:
            if not line:
                line = word
            elif len(line) + 1 + len(word) < width:
                line += " " + word
            else:
                out.append(line)
                line = word
        out.append(line)
    return out
