"""Documents of imported FinQA/TAT-QA tasks: their table and text, typeset as a small PDF.

An imported task carries `public.table` (rows of cells), `public.pre_text` and
`public.post_text` (paragraphs). They are typeset with reportlab so the agent reads them
through the same PDF tools as a generated report; the numbers the verifier accepts as
operands are the numbers printed in those cells and paragraphs.
"""

from __future__ import annotations

import io
from typing import Any

from palaestra.envs.finance.document import numbers_in, parse_number
from palaestra.envs.finance.finqa_exec import cell_value
from palaestra.verifiers.finance import Numbers, normalize_label


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def render_imported(table: list[list[str]], pre_text: list[str], post_text: list[str]) -> bytes:
    from reportlab.lib import colors
    from reportlab.lib.pagesizes import letter
    from reportlab.lib.styles import ParagraphStyle
    from reportlab.platypus import Paragraph, SimpleDocTemplate, Spacer, Table, TableStyle

    buf = io.BytesIO()
    doc = SimpleDocTemplate(buf, pagesize=letter, invariant=True, title="Imported document")
    body = ParagraphStyle("b", fontName="Helvetica", fontSize=9.5, leading=12.5, spaceAfter=6)
    cell = ParagraphStyle("c", fontName="Helvetica", fontSize=8.5, leading=10)
    story: list[Any] = [Paragraph(_escape(t), body) for t in pre_text]
    rows = table
    if rows:
        width = max(len(r) for r in rows)
        data = [[Paragraph(_escape(c), cell) for c in r] + [""] * (width - len(r)) for r in rows]
        grid = Table(data, repeatRows=1)
        grid.setStyle(TableStyle([("GRID", (0, 0), (-1, -1), 0.5, colors.grey)]))
        story += [Spacer(1, 6), grid, Spacer(1, 6)]
    story += [Paragraph(_escape(t), body) for t in post_text]
    if not story:
        story.append(Paragraph("(empty document)", body))
    doc.build(story)
    return buf.getvalue()


def imported_numbers(table: list[list[str]], pre_text: list[str], post_text: list[str]) -> Numbers:
    """Every number printed in the table and the text, each as its own figure; a row's
    values for the table operations are its cells as FinQA reads them (`cell_value`: the
    first number of each cell), and a row with a cell that is not a number has none."""
    figures: dict[str, float] = {}
    rows: dict[str, list[list[str]]] = {}
    for r, row in enumerate(table):
        keys: list[str] | None = []
        for c, text in enumerate(row):
            cell_keys = []
            for k, token in enumerate(numbers_in(text)):
                value = parse_number(token)
                if value is not None:
                    key = f"t.{r}.{c}.{k}"
                    figures[key] = value
                    cell_keys.append(key)
            if c > 0 and keys is not None:
                keys = keys + cell_keys[:1] if cell_keys and cell_value(text) is not None else None
        if row and keys:
            rows.setdefault(normalize_label(row[0]), []).append(keys)
    for i, text in enumerate(pre_text + post_text):
        for k, token in enumerate(numbers_in(text)):
            value = parse_number(token)
            if value is not None:
                figures[f"x.{i}.{k}"] = value
    return Numbers(figures=figures, rows=rows)
