"""The truth behind a commentary question: each asked metric's values and change, from the accounts.

A question names two or three metrics and two fiscal years. The figures come from the
same accounts the PDF is typeset from (envs/finance/accounts.py), so they are what the
report prints (amounts) or what its printed figures give (margins, to two decimals). The
reference text built here is what the judge compares a commentary against: the server
builds it at verify time from the private seeds and never sends it to a client.

Each reference line has one fixed shape, so a reader (a judge model, or the scripted fake
in tests/peers/commentary_judge.py) can find every figure, its unit and the direction:
`- <metric> (<kind>): FY<a> <value>; FY<b> <value>; <increase|decrease> of <size>.`
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from palaestra.envs.finance.accounts import Accounts

Kind = Literal["amount", "margin"]

# Statement offsets: 0 is the report's fiscal year, 1 the prior year; 2..4 are printed only
# in the five-year summary (`hist.` facts), for the lines it carries.
HISTORY = ("revenue", "operating_income", "net_income", "total_assets")
MIN_AMOUNT_CHANGE_PCT = 1.0  # smaller changes make a direction too easy to call "flat"
MIN_MARGIN_CHANGE_PP = 0.3


@dataclass(frozen=True)
class Metric:
    """A metric a question may ask about: an amount line, or a margin of two lines."""

    name: str  # as the question writes it
    kind: Kind
    line: str  # the amount's fact line (is.revenue), or the margin's numerator line
    statement: str = "is"  # the statement prefix of `line` for offsets 0 and 1

    def years(self) -> range:
        """The offsets whose figures the report prints (or lets a reader compute)."""
        return range(5) if self.line in HISTORY else range(2)


METRICS: dict[str, Metric] = {
    m.name: m
    for m in (
        Metric("revenue", "amount", "revenue"),
        Metric("gross profit", "amount", "gross_profit"),
        Metric("operating income", "amount", "operating_income"),
        Metric("net income", "amount", "net_income"),
        Metric("net cash from operating activities", "amount", "ocf", "cf"),
        Metric("total assets", "amount", "total_assets", "bs"),
        Metric("gross margin", "margin", "gross_profit"),
        Metric("operating margin", "margin", "operating_income"),
        Metric("net margin", "margin", "net_income"),
    )
}


def amount(accounts: Accounts, metric: Metric, offset: int) -> float:
    """A printed amount in the report's display units (thousands or millions)."""
    if offset <= 1:
        return accounts[f"{metric.statement}.{metric.line}.{offset}"]
    return accounts[f"hist.{metric.line}.{offset}"]


def value(accounts: Accounts, metric: Metric, offset: int) -> float:
    """The metric in a year: an amount in display units, or a margin in percent (2 dp)."""
    if metric.kind == "amount":
        return amount(accounts, metric, offset)
    revenue = amount(accounts, METRICS["revenue"], offset)
    return round(100 * amount(accounts, metric, offset) / revenue, 2)


@dataclass(frozen=True)
class Change:
    """One metric from one year to another: the figures a right commentary states."""

    metric: Metric
    year_from: int
    year_to: int
    before: float
    after: float

    @property
    def direction(self) -> Literal["increase", "decrease"]:
        return "increase" if self.after > self.before else "decrease"

    @property
    def size(self) -> float:
        """Percent change of an amount; percentage points of a margin (both unsigned)."""
        if self.metric.kind == "margin":
            return round(abs(self.after - self.before), 2)
        return round(abs(self.after - self.before) / abs(self.before) * 100, 2)

    def clear(self) -> bool:
        """Is the change large enough that its direction is not a matter of rounding?"""
        if self.metric.kind == "margin":
            return self.size >= MIN_MARGIN_CHANGE_PP
        return self.size >= MIN_AMOUNT_CHANGE_PCT and self.before > 0 and self.after > 0


@dataclass(frozen=True)
class Truth:
    """What a commentary question asks and the accounts answer."""

    company: str
    currency: str
    scale_word: str  # "thousands" or "millions": the report's display unit
    changes: tuple[Change, ...]

    @property
    def metrics(self) -> list[str]:
        return [c.metric.name for c in self.changes]


def truth_of(accounts: Accounts, metrics: list[str], offset_from: int, offset_to: int) -> Truth:
    """The changes of `metrics` between two offsets of the accounts (KeyError: unknown)."""
    s = accounts.structure
    changes = tuple(
        Change(
            METRICS[name],
            s.year - offset_from,
            s.year - offset_to,
            value(accounts, METRICS[name], offset_from),
            value(accounts, METRICS[name], offset_to),
        )
        for name in metrics
    )
    return Truth(s.company, s.currency, s.scale_word, changes)


def figure(change: Change, x: float) -> str:
    """A figure of `change` as the reference and the oracle write it."""
    return f"{x:,.0f}" if change.metric.kind == "amount" else f"{x:.2f}%"


def size_text(change: Change) -> str:
    unit = "percentage points" if change.metric.kind == "margin" else "%"
    return f"{change.size:.2f} {unit}" if unit != "%" else f"{change.size:.2f}%"


def reference_text(truth: Truth) -> str:
    """The judge's reference: every figure with its unit, each change's direction and size."""
    lines = [
        f"Reference figures for {truth.company}, from the accounts behind its annual report "
        f"(amounts in {truth.currency} {truth.scale_word}; margins are the line over revenue, "
        "in percent).",
    ]
    for c in truth.changes:
        kind = (
            f"amount, {truth.currency} {truth.scale_word}"
            if c.metric.kind == "amount"
            else "margin, percent of revenue"
        )
        lines.append(
            f"- {c.metric.name} ({kind}): FY{c.year_from} {figure(c, c.before)}; "
            f"FY{c.year_to} {figure(c, c.after)}; {c.direction} of {size_text(c)}."
        )
    return "\n".join(lines)
