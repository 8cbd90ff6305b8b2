"""Render a layout to PDF with reportlab: cover, one- and two-column pages, long tables.

Financial tables split across pages with their header row repeated (reportlab's
`repeatRows`); ruled styles draw a grid, unruled ones draw nothing but text. Two-column
pages use a page template with two frames, so the text really flows in columns and a
reader has to know to finish the left column first.
"""

from __future__ import annotations

import io
import re
from typing import Any

from reportlab.lib import colors
from reportlab.lib.enums import TA_LEFT
from reportlab.lib.pagesizes import A4, letter
from reportlab.lib.styles import ParagraphStyle
from reportlab.lib.units import inch
from reportlab.platypus import (
    BaseDocTemplate,
    CondPageBreak,
    Frame,
    NextPageTemplate,
    PageTemplate,
    Paragraph,
    Spacer,
    Table,
    TableStyle,
)
from reportlab.platypus import PageBreak as RLPageBreak

from palaestra.envs.finance import layout as lay
from palaestra.envs.finance.profiles import Style

_PH = re.compile(r"\[\[([^\]]+)\]\]")


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def fill(text: str, figures: dict[str, lay.Figure]) -> str:
    """Replace figure placeholders by the figures' printed text."""
    return _PH.sub(lambda m: figures[m.group(1)].text, text)


class _Doc(BaseDocTemplate):  # type: ignore[misc]
    def __init__(self, buf: io.BytesIO, style: Style, footer: str, **kw: Any) -> None:
        size = letter if style.page == "letter" else A4
        super().__init__(
            buf,
            pagesize=size,
            leftMargin=0.8 * inch,
            rightMargin=0.8 * inch,
            topMargin=0.8 * inch,
            bottomMargin=0.8 * inch,
            **kw,
        )
        self.style = style
        self.footer = footer
        width, height = size
        w = width - 1.6 * inch
        h = height - 1.6 * inch
        gutter = 0.35 * inch
        col = (w - gutter) / 2
        one = Frame(0.8 * inch, 0.8 * inch, w, h, id="one")
        left = Frame(0.8 * inch, 0.8 * inch, col, h, id="left")
        right = Frame(0.8 * inch + col + gutter, 0.8 * inch, col, h, id="right")
        self.addPageTemplates(
            [
                PageTemplate("one", [one], onPage=self._decorate),
                PageTemplate("two", [left, right], onPage=self._decorate),
            ]
        )

    def _decorate(self, canvas: Any, doc: Any) -> None:
        canvas.saveState()
        r, g, b = self.style.accent
        canvas.setFillColorRGB(r, g, b)
        canvas.setStrokeColorRGB(r, g, b)
        width, height = self.pagesize
        canvas.setLineWidth(2)
        canvas.line(0.8 * inch, height - 0.55 * inch, width - 0.8 * inch, height - 0.55 * inch)
        canvas.setFont(self.style.font, 8)
        canvas.drawString(0.8 * inch, 0.5 * inch, self.footer)
        canvas.drawRightString(width - 0.8 * inch, 0.5 * inch, f"Page {doc.page}")
        canvas.restoreState()


def _styles(style: Style) -> dict[str, ParagraphStyle]:
    accent = colors.Color(*style.accent)
    return {
        "h0": ParagraphStyle(
            "h0", fontName=style.bold, fontSize=22, leading=28, textColor=accent, spaceAfter=16
        ),
        "h1": ParagraphStyle(
            "h1",
            fontName=style.bold,
            fontSize=15,
            leading=19,
            textColor=accent,
            spaceAfter=8,
            spaceBefore=6,
        ),
        "h2": ParagraphStyle(
            "h2",
            fontName=style.bold,
            fontSize=11.5,
            leading=15,
            textColor=accent,
            spaceAfter=5,
            spaceBefore=8,
        ),
        "body": ParagraphStyle(
            "body", fontName=style.font, fontSize=9.5, leading=12.5, alignment=TA_LEFT, spaceAfter=6
        ),
        "small": ParagraphStyle(
            "small", fontName=style.font, fontSize=7.5, leading=9.5, spaceAfter=4, spaceBefore=4
        ),
        "cell": ParagraphStyle("cell", fontName=style.font, fontSize=8.5, leading=10),
        "note": ParagraphStyle(
            "note",
            fontName=style.font,
            fontSize=8,
            leading=10,
            textColor=colors.Color(0.3, 0.3, 0.3),
            spaceAfter=3,
        ),
        "ttl": ParagraphStyle(
            "ttl", fontName=style.bold, fontSize=10.5, leading=13, spaceBefore=6, spaceAfter=2
        ),
    }


def _table(
    t: lay.Table, layout: lay.Layout, style: Style, width: float, st: dict[str, ParagraphStyle]
) -> list[Any]:
    data: list[list[str]] = [["", *t.columns]]
    bold_rows = []
    for i, row in enumerate(t.rows, start=1):
        cells = [layout.figures[k].text if k else "" for k in row.cells]
        data.append([("   " * row.indent) + row.label, *cells])
        if row.bold:
            bold_rows.append(i)
    n = len(t.columns)
    label_w = width * (0.52 if n <= 3 else 0.34)
    col_w = (width - label_w) / n
    table = Table(data, colWidths=[label_w] + [col_w] * n, repeatRows=1)
    cmds: list[tuple[Any, ...]] = [
        ("FONT", (0, 0), (-1, -1), style.font, 8.5),
        ("FONT", (0, 0), (-1, 0), style.bold, 8.5),
        ("ALIGN", (1, 0), (-1, -1), "RIGHT"),
        ("VALIGN", (0, 0), (-1, -1), "MIDDLE"),
        ("TOPPADDING", (0, 0), (-1, -1), 2.5),
        ("BOTTOMPADDING", (0, 0), (-1, -1), 2.5),
    ]
    for i in bold_rows:
        cmds.append(("FONT", (0, i), (-1, i), style.bold, 8.5))
    if t.ruled:
        cmds.append(("GRID", (0, 0), (-1, -1), 0.5, colors.Color(0.45, 0.45, 0.45)))
        cmds.append(("BACKGROUND", (0, 0), (-1, 0), colors.Color(0.92, 0.93, 0.95)))
    table.setStyle(TableStyle(cmds))
    return [
        CondPageBreak(1.5 * inch),
        Paragraph(_escape(t.title), st["ttl"]),
        Paragraph(_escape(t.note), st["note"]),
        table,
        Spacer(1, 8),
    ]


def render(layout: lay.Layout, style: Style) -> bytes:
    """The PDF bytes of a layout."""
    buf = io.BytesIO()
    doc = _Doc(
        buf,
        style,
        layout.footer,
        title=f"{layout.title} {layout.subtitle}",
        author=layout.title,
        invariant=True,
    )
    st = _styles(style)
    width = doc.width
    story: list[Any] = []
    for block in layout.blocks:
        if isinstance(block, lay.Heading):
            story.append(Paragraph(_escape(block.text), st[f"h{min(block.level, 2)}"]))
        elif isinstance(block, lay.Para):
            text = _escape(fill(block.text, layout.figures))
            story.append(Paragraph(text, st["small" if block.small else "body"]))
        elif isinstance(block, lay.PageBreak):
            story.append(RLPageBreak())
        elif isinstance(block, lay.Columns):
            story.append(NextPageTemplate("two"))
            story.append(RLPageBreak())
            story.append(Paragraph(_escape(block.title), st["h1"]))
            for para in block.paras:
                story.append(Paragraph(_escape(fill(para.text, layout.figures)), st["body"]))
            story.append(NextPageTemplate("one"))
        elif isinstance(block, lay.Table):
            story.extend(_table(block, layout, style, width, st))
    doc.build(story)
    return buf.getvalue()
