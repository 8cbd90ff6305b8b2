"""The report as data: pages of headings, narrative, tables and footnotes, before any PDF.

The same layout feeds the PDF renderer (report.py) and the figure registry the verifier
uses (`figures`): a figure is a fact the layout shows, with the exact text it shows, so the
registry is what the PDF says, and each key appears once (asserted here). Narrative filler
comes from the structure seed and has no digits; the only numbers in running text are
figures, years and note or page references.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from palaestra.envs.finance.accounts import Accounts, sub_seed


@dataclass(frozen=True)
class Figure:
    key: str
    text: str  # as printed: "1,234", "(5,678)", "3.47"
    value: float  # signed value as printed, in the figure's own units


@dataclass
class Heading:
    text: str
    level: int = 1


@dataclass
class Para:
    text: str  # may hold figure placeholders [[key]]
    small: bool = False


@dataclass
class Columns:
    """A two-column page: the paragraphs flow down the left column, then the right."""

    title: str
    paras: list[Para]


@dataclass
class Row:
    label: str
    cells: list[str | None]  # fact keys (None: blank)
    bold: bool = False
    indent: int = 0


@dataclass
class Table:
    title: str
    note: str  # "(in thousands of USD, except per-share data)"
    columns: list[str]  # headers after the label column
    rows: list[Row]
    ruled: bool = True


@dataclass
class PageBreak:
    pass


Block = Heading | Para | Columns | Table | PageBreak


@dataclass
class Layout:
    title: str
    subtitle: str
    footer: str
    blocks: list[Block] = field(default_factory=list)
    figures: dict[str, Figure] = field(default_factory=dict)
    years: list[int] = field(default_factory=list)


def fmt(value: float, decimals: int, zero: str = "—") -> str:
    """Thousands separators, parentheses for negatives."""
    if value == 0:
        return zero
    text = f"{abs(value):,.{decimals}f}"
    return f"({text})" if value < 0 else text


_SENTENCES = (
    "{company} continued to invest in {noun} and in the people who serve our customers.",
    "Demand for {noun} remained resilient across our principal markets during the year.",
    "Management reviews the performance of each segment against its strategic plan every quarter.",
    "Our strategy is to grow {noun} while keeping a disciplined approach to capital allocation.",
    "We expanded our presence in {noun} through targeted investment and selective acquisitions.",
    "The Board believes the group is well placed to benefit from long-term trends in {industry}.",
    "Pricing actions and productivity programmes helped offset inflation in input costs.",
    "We remain committed to a strong balance sheet and an investment-grade credit profile.",
    "Working capital discipline remained a priority for every business unit.",
    "Our teams delivered new {noun} to customers on time despite supply chain disruption.",
    "Sustainability is integral to how we design, make and deliver {noun}.",
    "We continued to simplify our portfolio and to exit activities with lower returns.",
    "Customer retention improved as we broadened the range of {noun} we offer.",
    "Investment in digital tools reduced the cost of serving customers in {industry}.",
    "The outlook for the coming year reflects cautious assumptions about the macroeconomy.",
    "Foreign exchange movements affected reported results, mainly through translation.",
    "Our risk management framework identifies, assesses and mitigates the principal risks.",
    "Cyber security, regulatory change and talent retention remain among our principal risks.",
    "Competition in {industry} is intense and we compete on quality, service and price.",
    "We have a clear framework for returning surplus capital to shareholders.",
    "The Audit Committee reviewed the significant judgements made in preparing these accounts.",
    "Our employees are central to our culture of safety, integrity and accountability.",
    "We expect capital expenditure to remain focused on capacity, automation and maintenance.",
    "Acquired businesses were integrated ahead of plan and are performing as expected.",
    "Interest rate exposure is managed through a mix of fixed and floating rate borrowings.",
)

_SECTIONS = (
    "Chairman's statement",
    "Chief Executive's review",
    "Our business model",
    "Strategy and key performance indicators",
    "Markets and competition",
    "Principal risks and uncertainties",
    "Sustainability report",
    "Corporate governance",
    "Report of the Audit Committee",
    "Directors' remuneration report",
    "People and culture",
    "Shareholder information",
)


def _filler(rng: random.Random, accounts: Accounts, sentences: int) -> str:
    if sentences <= 0:
        return ""
    s = accounts.structure
    words = {"company": s.company, "industry": s.profile.industry}
    out = []
    for _ in range(sentences):
        template = rng.choice(_SENTENCES)
        out.append(template.format(noun=rng.choice(s.profile.nouns), **words))
    return " ".join(out)


class _Builder:
    def __init__(self, accounts: Accounts) -> None:
        self.a = accounts
        self.s = accounts.structure
        self.used: set[str] = set()
        self.figures: dict[str, Figure] = {}

    def key(self, key: str) -> str:
        """Register a figure the layout shows; each key once."""
        if key in self.used:
            raise AssertionError(f"{key} is shown twice")
        fact = self.a.facts[key]
        self.used.add(key)
        self.figures[key] = Figure(
            key, fmt(fact.value, fact.decimals, self.s.style.zero), fact.value
        )
        return key

    def ph(self, key: str) -> str:
        return f"[[{self.key(key)}]]"


def _statement_rows(b: _Builder, spec: list[tuple[str, str, bool, int]], years: int) -> list[Row]:
    rows = []
    for label, line, bold, indent in spec:
        if not line:
            rows.append(Row(label, [None] * years, bold, indent))
            continue
        cells: list[str | None] = []
        for off in range(years):
            key = f"{line}.{off}"
            cells.append(b.key(key) if key in b.a.facts else None)
        rows.append(Row(label, cells, bold, indent))
    return rows


def build_layout(accounts: Accounts, text: bool = True) -> Layout:
    """The report's layout; `text=False` leaves out the filler prose (for the figures only)."""
    s = accounts.structure
    b = _Builder(accounts)
    rng = random.Random(sub_seed("layout", s.seed, s.level))
    y = s.year
    ruled = s.style.ruled
    unit = f"(in {s.scale_word} of {s.currency}"
    money = unit + ")"
    per_share = unit + ", except per-share data)"
    years = [str(y), str(y - 1)]
    layout = Layout(
        title=f"{s.company}",
        subtitle=f"Annual Report {y}",
        footer=f"{s.company} · Annual Report {y}",
        years=[y - k for k in range(5)],
    )
    blocks = layout.blocks
    k = 1 if text else 0  # filler sentences are multiplied by k
    rnd_label = (
        "Research and development" if s.profile.rnd[1] >= 0.02 else "Other operating expenses"
    )
    note_restate = 2
    # -- narrative front section ------------------------------------------------------------
    blocks.append(Heading(f"{s.company} — Annual Report {y}", 0))
    blocks.append(
        Para(
            f"{s.company} is a company in {s.profile.industry}. This report covers the fiscal year "
            f"ended December 31, {y}. All amounts in the financial statements are presented "
            f"{money[1:-1]}."
        )
    )
    blocks.append(Para(_filler(rng, accounts, k * 6)))
    for i in range(s.sections):
        title = _SECTIONS[i % len(_SECTIONS)]
        paras = [
            Para(_filler(rng, accounts, k * rng.randint(5, 8))) for _ in range(rng.randint(5, 7))
        ]
        if i == 1:
            paras.insert(
                1,
                Para(
                    f"At the end of {y} the group employed {b.ph('nar.employees.0')} people, "
                    f"compared with {b.ph('nar.employees.1')} a year earlier. "
                    + _filler(rng, accounts, k * 2)
                ),
            )
            paras.insert(
                3,
                Para(
                    f"Our order backlog stood at {s.symbol}{b.ph('nar.backlog.0')} million "
                    f"at the end of the year. " + _filler(rng, accounts, k * 3)
                ),
            )
            paras.insert(
                4,
                Para(
                    f"The Board declared dividends of {s.symbol}{b.ph('nar.dps.0')} per share "
                    f"for {y}. " + _filler(rng, accounts, k * 2)
                ),
            )
        if s.style.two_column:
            blocks.append(Columns(title, paras))
        else:
            blocks.append(PageBreak())
            blocks.append(Heading(title))
            blocks.extend(paras)
    # -- five-year summary ------------------------------------------------------------------
    blocks.append(PageBreak())
    blocks.append(Heading("Selected financial data"))
    blocks.append(
        Para(
            f"The table below shows earlier years; {y} and {y - 1} are in the financial statements."
        )
    )
    hist_rows = [
        Row(label, [b.key(f"hist.{name}.{off}") for off in (2, 3, 4)])
        for label, name in (
            ("Revenue", "revenue"),
            ("Operating income", "operating_income"),
            ("Net income", "net_income"),
            ("Total assets", "total_assets"),
        )
    ]
    blocks.append(
        Table(
            "Five-year summary (earlier years)",
            money,
            [str(y - 2), str(y - 3), str(y - 4)],
            hist_rows,
            ruled,
        )
    )
    # -- statements --------------------------------------------------------------------------
    blocks.append(PageBreak())
    blocks.append(Heading("Consolidated income statement"))
    is_rows = _statement_rows(
        b,
        [
            ("Revenue", "is.revenue", True, 0),
            ("Cost of sales", "is.cogs", False, 1),
            ("Gross profit", "is.gross_profit", True, 0),
            ("Selling, general and administrative expenses", "is.sga", False, 1),
            (rnd_label, "is.rnd", False, 1),
            ("Depreciation and amortization", "is.da", False, 1),
            ("Operating income", "is.operating_income", True, 0),
            ("Interest expense", "is.interest", False, 1),
            ("Other income (expense), net", "is.other", False, 1),
            ("Income before income taxes", "is.pbt", True, 0),
            ("Income tax expense", "is.tax", False, 1),
            ("Net income", "is.net_income", True, 0),
            ("Earnings per share", "", True, 0),
            ("Basic", "is.eps", False, 1),
            ("Diluted", "is.eps_diluted", False, 1),
            ("Weighted average shares outstanding", "", True, 0),
            ("Basic", "is.shares", False, 1),
            ("Diluted", "is.diluted_shares", False, 1),
        ],
        2,
    )
    blocks.append(
        Table(
            "Consolidated income statement",
            per_share,
            [years[0], f"{years[1]} (restated¹)"],
            is_rows,
            ruled,
        )
    )
    blocks.append(Para(f"Shares outstanding are in {s.scale_word}.", small=True))
    if s.restatement == "reclass":
        footnote = (
            f"¹ Restated. In {y} the group reclassified freight and distribution costs from "
            f"selling, general and administrative expenses to cost of sales. As previously "
            f"reported, cost of sales for {y - 1} was {b.ph('rs.cogs.1')} and selling, "
            f"general and administrative expenses were {b.ph('rs.sga.1')}. Net income was not "
            f"affected. See note {note_restate}."
        )
    else:
        footnote = (
            f"¹ Restated. The group corrected the timing of revenue recognition on certain "
            f"multi-year contracts. As previously reported, revenue for {y - 1} was "
            f"{b.ph('rs.revenue.1')} and net income was {b.ph('rs.net_income.1')}. "
            f"See note {note_restate}."
        )
    blocks.append(Para(footnote, small=True))
    blocks.append(PageBreak())
    blocks.append(Heading("Consolidated balance sheet"))
    bs_rows = _statement_rows(
        b,
        [
            ("Assets", "", True, 0),
            ("Cash and cash equivalents", "bs.cash", False, 1),
            ("Short-term investments", "bs.sti", False, 1),
            ("Accounts receivable, net", "bs.ar", False, 1),
            ("Inventories", "bs.inv", False, 1),
            ("Prepaid expenses and other current assets", "bs.prepaid", False, 1),
            ("Total current assets", "bs.tca", True, 0),
            ("Property, plant and equipment, net", "bs.ppe", False, 1),
            ("Goodwill", "bs.goodwill", False, 1),
            ("Intangible assets, net", "bs.intangibles", False, 1),
            ("Other non-current assets", "bs.onca", False, 1),
            ("Total assets", "bs.total_assets", True, 0),
            ("Liabilities", "", True, 0),
            ("Accounts payable", "bs.ap", False, 1),
            ("Accrued liabilities", "bs.accrued", False, 1),
            ("Current portion of long-term debt", "bs.current_debt", False, 1),
            ("Total current liabilities", "bs.tcl", True, 0),
            ("Long-term debt", "bs.ltd", False, 1),
            ("Deferred tax liabilities", "bs.dtl", False, 1),
            ("Other non-current liabilities", "bs.oncl", False, 1),
            ("Total liabilities", "bs.total_liabilities", True, 0),
            ("Equity", "", True, 0),
            ("Share capital", "bs.share_capital", False, 1),
            ("Treasury shares", "bs.treasury", False, 1),
            ("Retained earnings", "bs.retained", False, 1),
            ("Accumulated other comprehensive income (loss)", "bs.aoci", False, 1),
            ("Total equity", "bs.total_equity", True, 0),
        ],
        2,
    )
    blocks.append(Table("Consolidated balance sheet", money, years, bs_rows, ruled))
    blocks.append(PageBreak())
    blocks.append(Heading("Consolidated statement of cash flows"))
    cf_rows = _statement_rows(
        b,
        [
            ("Operating activities", "", True, 0),
            ("Cash receipts from customers", "cf.receipts", False, 1),
            ("Cash paid to suppliers and employees", "cf.payments", False, 1),
            ("Interest paid", "cf.interest_paid", False, 1),
            ("Income taxes paid", "cf.taxes_paid", False, 1),
            ("Other operating cash flows, net", "cf.other_operating", False, 1),
            ("Net cash from operating activities", "cf.ocf", True, 0),
            ("Investing activities", "", True, 0),
            ("Purchases of property, plant and equipment", "cf.capex", False, 1),
            ("Acquisitions, net of cash acquired", "cf.acquisitions", False, 1),
            ("Net (purchases) sales of short-term investments", "cf.investments", False, 1),
            ("Other investing cash flows", "cf.other_investing", False, 1),
            ("Net cash used in investing activities", "cf.icf", True, 0),
            ("Financing activities", "", True, 0),
            ("Proceeds from borrowings", "cf.borrowings", False, 1),
            ("Repayments of borrowings", "cf.repayments", False, 1),
            ("Dividends paid", "cf.dividends", False, 1),
            ("Proceeds from issuance of shares", "cf.issued", False, 1),
            ("Repurchases of shares", "cf.repurchased", False, 1),
            ("Net cash from (used in) financing activities", "cf.fcf", True, 0),
            ("Net change in cash and restricted cash", "cf.net_change", True, 0),
            ("Effect of exchange rate changes", "cf.fx", False, 1),
            ("Cash and restricted cash at beginning of year", "cf.begin", False, 0),
            ("Cash and restricted cash at end of year", "cf.end", True, 0),
        ],
        2,
    )
    blocks.append(Table("Consolidated statement of cash flows", money, years, cf_rows, ruled))
    # -- notes ---------------------------------------------------------------------------------
    blocks.append(PageBreak())
    blocks.append(Heading("Notes to the consolidated financial statements"))
    blocks.append(Heading("1. Segment information", 2))
    blocks.append(
        Para(
            f"The group reports {_count_word(len(s.segments))} operating segments. Corporate costs "
            "are not allocated to segments. " + _filler(rng, accounts, k * 3)
        )
    )
    seg_rows = [
        Row(name, [b.key(f"seg.revenue.{i}.0"), b.key(f"seg.revenue.{i}.1")])
        for i, name in enumerate(s.segments)
    ]
    blocks.append(Table("Revenue by segment", money, years, seg_rows, ruled))
    prof_rows = [
        Row(name, [b.key(f"seg.profit.{i}.0"), b.key(f"seg.profit.{i}.1")])
        for i, name in enumerate(s.segments)
    ]
    prof_rows.append(
        Row("Corporate and eliminations", [b.key("seg.corporate.0"), b.key("seg.corporate.1")])
    )
    blocks.append(Table("Operating income by segment", money, years, prof_rows, ruled))
    blocks.append(Heading(f"{note_restate}. Restatement of prior-year figures", 2))
    blocks.append(
        Para(
            f"Figures for {y - 1} have been restated as described in the footnote to the income "
            "statement. " + _filler(rng, accounts, k * 3)
        )
    )
    blocks.append(Heading("3. Cash and restricted cash", 2))
    blocks.append(
        Para(
            f"Prepaid expenses and other current assets include restricted cash of "
            f"{b.ph('note.restricted.0')} at the end of {y} and {b.ph('note.restricted.1')} at the "
            f"end of {y - 1}, held as collateral. " + _filler(rng, accounts, k * 2)
        )
    )
    blocks.append(Heading("4. Quarterly results (unaudited)", 2))
    q_rows = [
        Row("Revenue", [b.key(f"q.revenue.{q}") for q in (1, 2, 3, 4)]),
        Row("Net income", [b.key(f"q.net_income.{q}") for q in (1, 2, 3, 4)]),
    ]
    blocks.append(
        Table(
            f"Quarterly results {y}",
            money,
            ["First quarter", "Second quarter", "Third quarter", "Fourth quarter"],
            q_rows,
            ruled,
        )
    )
    blocks.append(Heading("5. Revenue by country", 2))
    blocks.append(Para("Revenue is attributed to countries by the location of the customer."))
    geo_rows = [
        Row(name, [b.key(f"geo.{i}.0"), b.key(f"geo.{i}.1")]) for i, name in enumerate(s.countries)
    ]
    blocks.append(Table("Revenue by country", money, years, geo_rows, ruled))
    for i in range(max(0, s.sections - 3)):
        blocks.append(Heading(f"{6 + i}. {_NOTES[i % len(_NOTES)]}", 2))
        for _ in range(rng.randint(3, 5)):
            blocks.append(Para(_filler(rng, accounts, k * rng.randint(5, 7))))
    layout.figures = b.figures
    return layout


_NOTES = (
    "Accounting policies",
    "Critical judgements and estimates",
    "Financial risk management",
    "Leases",
    "Employee benefits",
    "Share-based payments",
    "Contingent liabilities",
    "Related parties",
    "Events after the reporting period",
)


def _count_word(n: int) -> str:
    return {3: "three", 4: "four", 5: "five"}.get(n, str(n))
