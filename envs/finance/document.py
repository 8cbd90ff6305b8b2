"""What the agent sees of a report: the real PDF, parsed once with pdfplumber.

`parse_pdf` reads every page's words and ruled tables with pdfplumber and keeps plain data
(`ParsedDocument`, JSON-serialisable, cached on disk beside the PDF), so every tool call
after the first parse is a lookup. Reading order is layout-aware: a page whose words leave
an empty vertical gutter near the middle, with the right column's lines starting at one x,
is read left column first, then right; lines that cross the gutter (headings, footnotes)
split the page into bands read top to bottom. Ruled tables come from pdfplumber's table
finder; unruled ones are rebuilt from word positions (a label, then numbers right-aligned
under column headers).
"""

from __future__ import annotations

import base64
import io
import re
import threading
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

LINE_TOLERANCE = 3.0
_NUMERIC = re.compile(r"^\(?-?[$€£]?\d[\d,]*(\.\d+)?\)?%?$|^[—–-]$")
_PDFIUM_LOCK = threading.Lock()  # PDFium is not thread-safe


@dataclass
class Word:
    text: str
    x0: float
    x1: float
    top: float


@dataclass
class ParsedPage:
    number: int  # 1-based
    width: float
    height: float
    lines: list[str]  # in reading order
    two_column: bool
    tables: list[list[list[str]]] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


@dataclass
class ParsedDocument:
    pages: list[ParsedPage]

    def to_json(self) -> dict[str, Any]:
        return {"pages": [asdict(p) for p in self.pages]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ParsedDocument:
        return cls([ParsedPage(**p) for p in data["pages"]])


def _lines(words: list[Word]) -> list[list[Word]]:
    rows: list[list[Word]] = []
    for word in sorted(words, key=lambda w: (w.top, w.x0)):
        if rows and abs(rows[-1][0].top - word.top) <= LINE_TOLERANCE:
            rows[-1].append(word)
        else:
            rows.append([word])
    return [sorted(r, key=lambda w: w.x0) for r in rows]


def _join(line: list[Word]) -> str:
    return " ".join(w.text for w in line)


def _gutter(words: list[Word], width: float) -> float | None:
    """The x of an empty vertical gutter between two columns of text, if the page has one."""
    if len(words) < 60:
        return None
    best: tuple[int, float] | None = None
    for step in range(0, 41):
        x = width * (0.4 + 0.005 * step)
        crossing = sum(1 for w in words if w.x0 < x < w.x1)
        if best is None or crossing < best[0]:
            best = (crossing, x)
    assert best is not None
    crossing, x = best
    left = [w for w in words if w.x1 <= x]
    right = [w for w in words if w.x0 >= x]
    if crossing > max(3, len(words) // 50) or min(len(left), len(right)) < max(
        20, 0.08 * len(words)
    ):
        return None
    if sum(1 for w in right if is_numeric(w.text)) > 0.2 * len(right):
        return None  # numbers on the right: a table, not a column of text
    starts = Counter(round(min(w.x0 for w in ln)) for ln in _lines(right))
    _, count = starts.most_common(1)[0]
    if count < 0.5 * sum(starts.values()):
        return None
    return x


def _reading_order(words: list[Word], gutter: float | None) -> list[str]:
    """Lines in reading order: bands split by gutter-crossing lines, left column first."""
    if gutter is None:
        return [_join(ln) for ln in _lines(words)]
    out: list[str] = []
    band: list[Word] = []

    def flush() -> None:
        out.extend(_join(ln) for ln in _lines([w for w in band if w.x1 <= gutter]))
        out.extend(_join(ln) for ln in _lines([w for w in band if w.x0 >= gutter]))
        band.clear()

    for line in _lines(words):
        if any(w.x0 < gutter < w.x1 for w in line):
            flush()
            out.append(_join(line))
        else:
            band.extend(line)
    flush()
    return out


def is_numeric(text: str) -> bool:
    return bool(_NUMERIC.match(text))


def _is_row(line: list[Word]) -> bool:
    tail = 0
    for word in reversed(line):
        if not is_numeric(word.text):
            break
        tail += 1
    if len(line) - tail > 12:
        return False  # running text that happens to end in a number
    return tail >= 2 or (tail >= 1 and tail < len(line))


def _unruled_tables(lines: list[list[Word]]) -> list[list[list[str]]]:
    """Tables without rules: runs of lines that end in right-aligned numbers."""
    blocks: list[tuple[int, list[list[Word]]]] = []  # (index of first line, lines)
    i = 0
    while i < len(lines):
        if not _is_row(lines[i]):
            i += 1
            continue
        start, block = i, [lines[i]]
        i += 1
        while i < len(lines):
            if _is_row(lines[i]):
                block.append(lines[i])
                i += 1
            elif i + 1 < len(lines) and _is_row(lines[i + 1]) and len(lines[i]) <= 8:
                block.append(lines[i])  # a section label inside the table ("Assets")
                i += 1
            else:
                break
        if sum(1 for ln in block if _is_row(ln)) >= 2:
            blocks.append((start, block))
    out: list[list[list[str]]] = []
    for start, rows in blocks:
        rights = sorted({round(w.x1) for ln in rows for w in ln if is_numeric(w.text)})
        columns: list[float] = []
        for x in rights:
            if not columns or x - columns[-1] > 12:
                columns.append(x)
            else:
                columns[-1] = x
        table: list[list[str]] = []
        before = lines[start - 1] if start > 0 else []
        if before and not _is_row(before) and all(w.x0 > columns[0] - 160 for w in before):
            cells = [""] * (len(columns) + 1)
            for w in before:
                col = min(range(len(columns)), key=lambda c: abs(columns[c] - w.x1))
                cells[col + 1] = (cells[col + 1] + " " + w.text).strip()
            table.append(cells)
        for ln in rows:
            cells = [""] * (len(columns) + 1)
            label: list[str] = []
            for w in ln:
                if is_numeric(w.text) and columns and (label or w.x0 > columns[0] - 120):
                    col = min(range(len(columns)), key=lambda c: abs(columns[c] - w.x1))
                    cells[col + 1] = w.text
                else:
                    label.append(w.text)
            cells[0] = " ".join(label)
            table.append(cells)
        out.append(table)
    return out


def _clean(cell: str | None) -> str:
    return " ".join((cell or "").split())


def parse_pdf(data: bytes) -> ParsedDocument:
    """Parse every page of a PDF with pdfplumber (CPU-bound: call it off the event loop)."""
    import pdfplumber  # imported on first use: the server imports every family at start

    pages: list[ParsedPage] = []
    with pdfplumber.open(io.BytesIO(data)) as pdf:
        for number, page in enumerate(pdf.pages, start=1):
            raw = page.extract_words(x_tolerance=1.5, y_tolerance=2.5)
            words = [
                Word(str(w["text"]), float(w["x0"]), float(w["x1"]), float(w["top"])) for w in raw
            ]
            body = [w for w in words if 0.6 * 72 < w.top < float(page.height) - 0.75 * 72]
            lines = _lines(body)
            gutter = _gutter(words, float(page.width))
            tables = [
                [[_clean(c) for c in row] for row in table]
                for table in page.extract_tables()
                if table and len(table) >= 2
            ]
            if not tables and gutter is None:
                tables = _unruled_tables(lines)
            pages.append(
                ParsedPage(
                    number=number,
                    width=float(page.width),
                    height=float(page.height),
                    lines=_reading_order(words, gutter),
                    two_column=gutter is not None,
                    tables=tables,
                )
            )
    return ParsedDocument(pages)


def render_png(data: bytes, page: int, scale: float = 1.25) -> str:
    """One page as a base64 PNG (pypdfium2)."""
    import pypdfium2 as pdfium

    with _PDFIUM_LOCK:
        pdf = pdfium.PdfDocument(data)
        try:
            image = pdf[page - 1].render(scale=scale).to_pil()
        finally:
            pdf.close()
    buf = io.BytesIO()
    image.save(buf, format="PNG", optimize=False)
    return base64.b64encode(buf.getvalue()).decode("ascii")


_NUMBER_IN_TEXT = re.compile(r"\(?\d+(?:,\d{3})*(?:\.\d+)?\)?")


def numbers_in(text: str) -> list[str]:
    """Number tokens as printed in running text or cells: '1,234', '(5,678)', '3.47'."""
    return _NUMBER_IN_TEXT.findall(text)


def parse_number(token: str) -> float | None:
    """A printed number's signed value: parentheses are negative, separators dropped."""
    text = token.strip()
    negative = text.startswith("(") and text.endswith(")")
    text = text.strip("()").replace(",", "").rstrip("%").lstrip("$€£")
    try:
        value = float(text)
    except ValueError:
        return None
    return -value if negative else value
