"""Questions with FinQA-style gold programs, drawn from the accounts of one report.

Ten domains, three levels each. A template writes its gold program over fact keys
(`{key}`: the figure as printed, without its sign; `{=key}`: with it), so the same program
gives the gold answer for the document and for any regeneration of it with other numbers.
Level 1 reads one statement, level 2 combines lines or years, level 3 crosses statements,
notes, footnotes and narrative (and asks in another scale).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass

from palaestra.envs.finance.accounts import Accounts, Structure
from palaestra.envs.finance.layout import Layout, Table
from palaestra.verifiers.finance import Gold, Kind, Numbers, Scale, normalize_label, run_keys

DOMAINS = (
    "growth",
    "margins",
    "ratios",
    "liquidity",
    "leverage",
    "cash_conversion",
    "segment_share",
    "restatement",
    "per_share",
    "cagr",
)
LEVELS = (1, 2, 3)


@dataclass(frozen=True)
class Question:
    domain: str
    level: int
    text: str
    keys_program: str
    kind: Kind
    decimals: int
    scale: Scale = "units"
    prior_keys_program: str = ""  # the same question a year earlier, for the cheat

    def gold(self, accounts: Accounts, numbers: Numbers) -> Gold:
        result = run_keys(self.keys_program, numbers)
        factor = float(accounts.structure.scale) if self.kind == "money" else 1.0
        return Gold(
            kind=self.kind,
            value=result * factor,
            decimals=self.decimals,
            scale=self.scale,
            program=numbers_program(self.keys_program, numbers),
            keys_program=self.keys_program,
            factor=factor,
        )


def numbers_program(keys_program: str, numbers: Numbers) -> str:
    """The program as an agent would write it: the printed numbers, no separators."""

    def sub(match: re.Match[str]) -> str:
        signed, key = match.group(1) == "=", match.group(2)
        value = numbers.figures[key]
        number = value if signed else abs(value)
        text = f"{number:.6f}".rstrip("0").rstrip(".")
        return text

    return re.sub(r"\{(=?)([^{}]+)\}", sub, keys_program)


def _growth(a: str, b: str) -> str:
    return f"subtract({a}, {b}), divide(#0, {b})"


def _shift(program: str) -> str:
    """The same program a year earlier (.0 → .1), or '' if it already uses the prior year."""
    if re.search(r"\.[1-9]\}", program):
        return ""
    return re.sub(r"\.0\}", ".1}", program)


_METRIC = {
    "is.revenue": "revenue",
    "is.gross_profit": "gross profit",
    "is.sga": "selling, general and administrative expenses",
    "is.operating_income": "operating income",
    "is.net_income": "net income",
    "cf.ocf": "net cash from operating activities",
    "bs.total_assets": "total assets",
}


Template = Callable[[Accounts, random.Random], Question]


def _q(
    domain: str,
    level: int,
    text: str,
    program: str,
    kind: Kind,
    decimals: int,
    scale: Scale = "units",
    prior: str | None = None,
) -> Question:
    return Question(
        domain,
        level,
        text,
        program,
        kind,
        decimals,
        scale,
        _shift(program) if prior is None else prior,
    )


def _scale(s: Structure) -> Scale:
    return "thousands" if s.scale == 1_000 else "millions"


def _pct(d: int) -> str:
    return f"Answer in percent, rounded to {d} decimal place{'s' if d > 1 else ''}."


def _ratio() -> str:
    return "Answer as a ratio (for example 1.25), rounded to 2 decimal places."


def growth(a: Accounts, rng: random.Random, level: int) -> Question:
    s = a.structure
    y, p = s.year, s.year - 1
    if level == 3:
        text = (
            f"By what percentage did revenue per employee (revenue divided by the year-end "
            f"number of employees) change from {p} to {y}? A decrease is negative. " + _pct(1)
        )
        prog = (
            "divide({is.revenue.0}, {nar.employees.0}), "
            "divide({is.revenue.1}, {nar.employees.1}), subtract(#0, #1), divide(#2, #1)"
        )
        return _q("growth", 3, text, prog, "percent", 1, prior="")
    lines = (
        ["is.revenue", "is.gross_profit", "is.sga"]
        if level == 1
        else ["is.operating_income", "is.net_income", "cf.ocf"]
    )
    line = rng.choice(lines)
    text = (
        f"By what percentage did {_METRIC[line]} change from {p} to {y}? "
        f"A decrease is negative. " + _pct(1)
    )
    return _q(
        "growth", level, text, _growth(f"{{{line}.0}}", f"{{{line}.1}}"), "percent", 1, prior=""
    )


def margins(a: Accounts, rng: random.Random, level: int) -> Question:
    s = a.structure
    y, p = s.year, s.year - 1
    if level == 1:
        line = rng.choice(["is.gross_profit", "is.operating_income", "is.net_income"])
        name = {
            "is.gross_profit": "gross",
            "is.operating_income": "operating",
            "is.net_income": "net",
        }[line]
        text = (
            f"What was the {name} margin ({_METRIC[line]} as a share of revenue) in {y}? " + _pct(1)
        )
        return _q("margins", 1, text, f"divide({{{line}.0}}, {{is.revenue.0}})", "percent", 1)
    if level == 2:
        text = (
            f"By how many percentage points did the operating margin (operating income as a "
            f"share of revenue) change from {p} to {y}? A decrease is negative. "
            f"Answer in percent (percentage points), rounded to 2 decimal places."
        )
        prog = (
            "divide({is.operating_income.0}, {is.revenue.0}), "
            "divide({is.operating_income.1}, {is.revenue.1}), subtract(#0, #1)"
        )
        return _q("margins", 2, text, prog, "percent", 2, prior="")
    i = s.focus_segment
    name = s.segments[i]
    text = (
        f"What was the operating margin of the {name} segment (its operating income as a "
        f"share of its revenue) in {y}? " + _pct(1)
    )
    return _q(
        "margins", 3, text, f"divide({{seg.profit.{i}.0}}, {{seg.revenue.{i}.0}})", "percent", 1
    )


def ratios(a: Accounts, rng: random.Random, level: int) -> Question:
    y = a.structure.year
    if level == 1:
        text = (
            f"What was the effective tax rate (income tax expense as a share of income "
            f"before income taxes) in {y}? " + _pct(1)
        )
        return _q("ratios", 1, text, "divide({is.tax.0}, {is.pbt.0})", "percent", 1)
    if level == 2:
        text = (
            f"What was the return on average equity in {y} (net income divided by the "
            f"average of total equity at the start and end of the year)? " + _pct(1)
        )
        prog = (
            "add({bs.total_equity.0}, {bs.total_equity.1}), divide(#0, const_2), "
            "divide({is.net_income.0}, #1)"
        )
        return _q("ratios", 2, text, prog, "percent", 1, prior="")
    text = (
        f"What was inventory turnover in {y}: cost of sales divided by the average of "
        f"inventories at the start and end of the year? " + _ratio()
    )
    prog = "add({bs.inv.0}, {bs.inv.1}), divide(#0, const_2), divide({is.cogs.0}, #1)"
    return _q("ratios", 3, text, prog, "ratio", 2, prior="")


def liquidity(a: Accounts, rng: random.Random, level: int) -> Question:
    s = a.structure
    y, p = s.year, s.year - 1
    if level == 1:
        text = (
            f"What was the current ratio (total current assets divided by total current "
            f"liabilities) at the end of {y}? " + _ratio()
        )
        return _q("liquidity", 1, text, "divide({bs.tca.0}, {bs.tcl.0})", "ratio", 2)
    if level == 2:
        text = (
            f"What was the quick ratio at the end of {y}: cash and cash equivalents, "
            f"short-term investments and accounts receivable, divided by total current "
            f"liabilities? " + _ratio()
        )
        prog = "add({bs.cash.0}, {bs.sti.0}), add(#0, {bs.ar.0}), divide(#1, {bs.tcl.0})"
        return _q("liquidity", 2, text, prog, "ratio", 2)
    big: Scale = "millions" if s.scale == 1_000 else "billions"
    text = (
        f"By how much did net working capital (total current assets minus total current "
        f"liabilities) change from the end of {p} to the end of {y}? A decrease is "
        f"negative. Answer in {big} of {s.currency}, rounded to 1 decimal place."
    )
    prog = "subtract({bs.tca.0}, {bs.tcl.0}), subtract({bs.tca.1}, {bs.tcl.1}), subtract(#0, #1)"
    return _q("liquidity", 3, text, prog, "money", 1, big, prior="")


def leverage(a: Accounts, rng: random.Random, level: int) -> Question:
    y = a.structure.year
    if level == 1:
        text = (
            f"What was the debt-to-equity ratio at the end of {y} (current portion of "
            f"long-term debt plus long-term debt, divided by total equity)? " + _ratio()
        )
        prog = "add({bs.current_debt.0}, {bs.ltd.0}), divide(#0, {bs.total_equity.0})"
        return _q("leverage", 1, text, prog, "ratio", 2)
    if level == 2:
        text = (
            f"What was the interest coverage ratio in {y} (operating income divided by "
            f"interest expense)? " + _ratio()
        )
        return _q(
            "leverage", 2, text, "divide({is.operating_income.0}, {is.interest.0})", "ratio", 2
        )
    text = (
        f"What was net debt to EBITDA in {y}? Net debt is the current portion of long-term "
        f"debt plus long-term debt minus cash and cash equivalents; EBITDA is operating "
        f"income plus depreciation and amortization. " + _ratio()
    )
    prog = (
        "add({bs.current_debt.0}, {bs.ltd.0}), subtract(#0, {bs.cash.0}), "
        "add({is.operating_income.0}, {is.da.0}), divide(#1, #2)"
    )
    return _q("leverage", 3, text, prog, "ratio", 2)


def cash_conversion(a: Accounts, rng: random.Random, level: int) -> Question:
    s = a.structure
    y = s.year
    if level == 1:
        text = (
            f"What was free cash flow in {y} (net cash from operating activities minus "
            f"purchases of property, plant and equipment)? Answer in {_scale(s)} of "
            f"{s.currency}, rounded to 0 decimal places."
        )
        return _q(
            "cash_conversion",
            1,
            text,
            "subtract({cf.ocf.0}, {cf.capex.0})",
            "money",
            0,
            _scale(s),
        )
    if level == 2:
        text = (
            f"What was the cash conversion ratio in {y} (net cash from operating activities "
            f"divided by net income)? " + _ratio()
        )
        return _q("cash_conversion", 2, text, "divide({cf.ocf.0}, {is.net_income.0})", "ratio", 2)
    text = (
        f"What was the free cash flow margin in {y}: net cash from operating activities "
        f"minus purchases of property, plant and equipment, as a share of revenue? " + _pct(1)
    )
    prog = "subtract({cf.ocf.0}, {cf.capex.0}), divide(#0, {is.revenue.0})"
    return _q("cash_conversion", 3, text, prog, "percent", 1)


def segment_share(a: Accounts, rng: random.Random, level: int) -> Question:
    s = a.structure
    y, p = s.year, s.year - 1
    i = s.focus_segment
    name = s.segments[i]
    if level == 1:
        text = f"What share of total revenue did the {name} segment contribute in {y}? " + _pct(1)
        return _q(
            "segment_share",
            1,
            text,
            f"divide({{seg.revenue.{i}.0}}, {{is.revenue.0}})",
            "percent",
            1,
        )
    if level == 2:
        text = (
            f"By how many percentage points did the {name} segment's share of total revenue "
            f"change from {p} to {y}? A decrease is negative. Answer in percent "
            f"(percentage points), rounded to 2 decimal places."
        )
        prog = (
            f"divide({{seg.revenue.{i}.0}}, {{is.revenue.0}}), "
            f"divide({{seg.revenue.{i}.1}}, {{is.revenue.1}}), subtract(#0, #1)"
        )
        return _q("segment_share", 2, text, prog, "percent", 2, prior="")
    cells = ", ".join(f"{{seg.profit.{j}.0}}" for j in range(len(s.segments)))
    text = (
        f"What share of the combined operating income of all segments (before corporate "
        f"and eliminations) came from the {name} segment in {y}? " + _pct(1)
    )
    prog = f"table_sum({cells}), divide({{seg.profit.{i}.0}}, #0)"
    return _q("segment_share", 3, text, prog, "percent", 1)


def restatement(a: Accounts, rng: random.Random, level: int) -> Question:
    s = a.structure
    y, p = s.year, s.year - 1
    money = f"Answer in {_scale(s)} of {s.currency}, rounded to 0 decimal places."
    if s.restatement == "reclass":
        if level == 1:
            text = (
                f"By how much did the restatement change cost of sales for {p} (restated "
                f"minus as previously reported)? A decrease is negative. " + money
            )
            return _q(
                "restatement",
                1,
                text,
                "subtract({is.cogs.1}, {rs.cogs.1})",
                "money",
                0,
                _scale(s),
                prior="{rs.cogs.1}",
            )
        if level == 2:
            text = (
                f"What was the gross margin for {p} as previously reported, before the "
                f"restatement? " + _pct(1)
            )
            prog = "subtract({is.revenue.1}, {rs.cogs.1}), divide(#0, {is.revenue.1})"
            return _q(
                "restatement",
                2,
                text,
                prog,
                "percent",
                1,
                prior="divide({is.gross_profit.1}, {is.revenue.1})",
            )
        text = (
            f"By how many percentage points did the restatement change the gross margin for "
            f"{p} (restated minus as previously reported)? A decrease is negative. Answer in "
            f"percent (percentage points), rounded to 2 decimal places."
        )
        prog = (
            "divide({is.gross_profit.1}, {is.revenue.1}), "
            "subtract({is.revenue.1}, {rs.cogs.1}), divide(#1, {is.revenue.1}), "
            "subtract(#0, #2)"
        )
        return _q(
            "restatement",
            3,
            text,
            prog,
            "percent",
            2,
            prior="divide({is.gross_profit.1}, {is.revenue.1})",
        )
    if level == 1:
        text = (
            f"By how much did the restatement change revenue for {p} (restated minus as "
            f"previously reported)? A decrease is negative. " + money
        )
        return _q(
            "restatement",
            1,
            text,
            "subtract({is.revenue.1}, {rs.revenue.1})",
            "money",
            0,
            _scale(s),
            prior="{rs.revenue.1}",
        )
    if level == 2:
        text = (
            f"Using revenue for {p} as previously reported (before the restatement), by what "
            f"percentage did revenue change from {p} to {y}? A decrease is negative. " + _pct(1)
        )
        return _q(
            "restatement",
            2,
            text,
            _growth("{is.revenue.0}", "{rs.revenue.1}"),
            "percent",
            1,
            prior=_growth("{is.revenue.0}", "{is.revenue.1}"),
        )
    text = (
        f"By how many percentage points did the restatement change the net margin for {p} "
        f"(restated net income over restated revenue, minus the same ratio as previously "
        f"reported)? A decrease is negative. Answer in percent (percentage points), rounded "
        f"to 2 decimal places."
    )
    prog = (
        "divide({is.net_income.1}, {is.revenue.1}), "
        "divide({rs.net_income.1}, {rs.revenue.1}), subtract(#0, #1)"
    )
    return _q(
        "restatement",
        3,
        text,
        prog,
        "percent",
        2,
        prior="divide({is.net_income.1}, {is.revenue.1})",
    )


def per_share(a: Accounts, rng: random.Random, level: int) -> Question:
    s = a.structure
    y = s.year
    each = f"Answer in {s.currency} per share, rounded to 2 decimal places."
    if level == 1:
        text = (
            f"What was book value per share at the end of {y} (total equity divided by the "
            f"basic weighted average shares outstanding)? " + each
        )
        return _q(
            "per_share", 1, text, "divide({bs.total_equity.0}, {is.shares.0})", "per_share", 2
        )
    if level == 2:
        text = (
            f"What was the dividend payout ratio for {y}: the dividend per share the Board "
            f"declared, divided by basic earnings per share? " + _pct(1)
        )
        return _q(
            "per_share",
            2,
            text,
            "divide({nar.dps.0}, {is.eps.0})",
            "percent",
            1,
            prior="divide({nar.dps.0}, {is.eps.1})",
        )
    text = (
        f"What was free cash flow per share in {y}: net cash from operating activities minus "
        f"purchases of property, plant and equipment, divided by basic weighted average "
        f"shares outstanding? " + each
    )
    prog = "subtract({cf.ocf.0}, {cf.capex.0}), divide(#0, {is.shares.0})"
    return _q("per_share", 3, text, prog, "per_share", 2)


def cagr(a: Accounts, rng: random.Random, level: int) -> Question:
    s = a.structure
    y = s.year
    line, hist, n = {
        1: ("is.revenue", "hist.revenue", 2),
        2: ("is.net_income", "hist.net_income", 3),
        3: ("bs.total_assets", "hist.total_assets", 4),
    }[level]
    word = {2: "two", 3: "three", 4: "four"}[n]
    text = (
        f"What was the compound annual growth rate of {_METRIC[line]} over the {word} years "
        f"from {y - n} to {y}? A decline is negative. " + _pct(1)
    )
    prog = (
        f"divide(const_1, const_{n}), divide({{{line}.0}}, {{{hist}.{n}}}), exp(#1, #0), "
        f"subtract(#2, const_1)"
    )
    prior = f"divide({{{line}.0}}, {{{line}.1}}), subtract(#0, const_1)"
    return _q("cagr", level, text, prog, "percent", 1, prior=prior)


TEMPLATES: dict[str, Callable[[Accounts, random.Random, int], Question]] = {
    "growth": growth,
    "margins": margins,
    "ratios": ratios,
    "liquidity": liquidity,
    "leverage": leverage,
    "cash_conversion": cash_conversion,
    "segment_share": segment_share,
    "restatement": restatement,
    "per_share": per_share,
    "cagr": cagr,
}


def numbers_of(layout: Layout) -> Numbers:
    """What the verifier knows of a generated document: its figures, years and table rows."""
    rows: dict[str, list[list[str]]] = {}
    for block in layout.blocks:
        if isinstance(block, Table):
            for row in block.rows:
                keys = [k for k in row.cells if k]
                if keys:
                    rows.setdefault(normalize_label(row.label), []).append(keys)
    return Numbers(
        figures={k: f.value for k, f in layout.figures.items()},
        labels=frozenset(float(y) for y in layout.years),
        rows=rows,
    )


def make_question(domain: str, level: int, accounts: Accounts, seed: int) -> Question:
    rng = random.Random(f"question/{domain}/{level}/{seed}")
    return TEMPLATES[domain](accounts, rng, level)
