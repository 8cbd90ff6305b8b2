"""One consistent set of accounts, from which a whole annual report is drawn.

The model runs a company from an opening balance sheet through five fiscal years. Every
flow is an integer in the document's display units (thousands or millions), and the
statements tie by construction:

- net income = revenue − cost of sales − SG&A − R&D − D&A − interest + other income − tax;
- the direct-method cash flow: receipts from customers = revenue − ΔAR; payments to
  suppliers and employees = cost of sales + SG&A + R&D + ΔInventory + ΔPrepaid − ΔAP −
  ΔAccrued; taxes paid = tax − ΔDeferred tax; so operating cash flow = NI + D&A − Δworking
  capital + ΔDTL + ΔOther non-current liabilities;
- cash (with restricted cash) at the end = beginning + operating + investing + financing +
  the effect of exchange rates, and that effect is the year's other comprehensive income;
- total assets = total liabilities + total equity every year; retained earnings roll
  forward by net income less dividends.

Facts are named `<statement>.<line>.<offset>` where offset 0 is the fiscal year, 1 the
prior year and so on. The structure seed fixes everything but the numbers (profile, style,
year, scale, segments, countries, restatement kind); the value seed fixes the numbers, so a
document regenerated with another value seed has the same rows and pages and other figures.
Every figure the report shows has a magnitude no other figure has (and none equals a year
or is under 100 unless it has decimals), so each number traces to one cell.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field

from palaestra.envs.finance.profiles import (
    COUNTRIES,
    CURRENCIES,
    NAME_FIRST,
    NAME_SECOND,
    PROFILES,
    STYLES,
    Profile,
    Style,
)

MAX_ATTEMPTS = 200
OFFSETS = (4, 3, 2, 1, 0)


def sub_seed(*parts: object) -> int:
    """A stable 63-bit seed from any parts (Python's hash() is salted per process)."""
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


@dataclass(frozen=True)
class Structure:
    """What the structure seed fixes: everything but the numbers."""

    seed: int
    level: int
    profile: Profile
    style: Style
    company: str
    currency: str
    symbol: str
    year: int
    scale: int  # 1_000 or 1_000_000 (display unit of money and shares)
    segments: tuple[str, ...]
    countries: tuple[str, ...]
    restatement: str  # "reclass" or "correction"
    focus_segment: int
    sections: int  # narrative sections (drives page count)

    @property
    def scale_word(self) -> str:
        return "thousands" if self.scale == 1_000 else "millions"


def structure(seed: int, level: int) -> Structure:
    rng = random.Random(sub_seed("structure", seed, level))
    profile = rng.choice(PROFILES)
    style = rng.choice(STYLES)
    currency, symbol = rng.choice(CURRENCIES)
    n_segments = rng.randint(3, 5)
    n_countries = {1: rng.randint(10, 16), 2: rng.randint(36, 48), 3: rng.randint(60, 75)}[level]
    return Structure(
        seed=seed,
        level=level,
        profile=profile,
        style=style,
        company=f"{rng.choice(NAME_FIRST)} {rng.choice(NAME_SECOND)}",
        currency=currency,
        symbol=symbol,
        year=rng.randint(2016, 2025),
        scale=rng.choice((1_000, 1_000, 1_000_000)),
        segments=tuple(rng.sample(profile.segments, n_segments)),
        countries=tuple(rng.sample(COUNTRIES, n_countries)),
        restatement=rng.choice(("reclass", "correction")),
        focus_segment=rng.randrange(n_segments),
        sections={1: 4, 2: 9, 3: 15}[level],
    )


@dataclass(frozen=True)
class Fact:
    key: str
    value: float  # signed, in display units (money and shares) or as shown (per share)
    decimals: int = 0


@dataclass
class Accounts:
    structure: Structure
    value_seed: int
    facts: dict[str, Fact] = field(default_factory=dict)

    def __getitem__(self, key: str) -> float:
        return self.facts[key].value

    def __contains__(self, key: object) -> bool:
        return key in self.facts


class _Collision(Exception):
    pass


def _u(rng: random.Random, bounds: tuple[float, float]) -> float:
    return rng.uniform(*bounds)


def _bad(value: float, year: int) -> bool:
    return value < 100 or year - 12 <= value <= year + 2


def _partition(
    rng: random.Random, total: int, n: int, taken: set[float], year: int, floor: int = 150
) -> list[int]:
    """`n` positive integers (each at least `floor`) that sum to `total`, avoiding `taken`."""
    if total < n * floor * 2:
        raise _Collision("total too small to partition")
    weights = [rng.lognormvariate(0, 0.6) for _ in range(n)]
    spare = total - n * floor
    parts = [floor + int(spare * w / sum(weights)) for w in weights]
    parts[-1] += total - sum(parts)
    for i in range(n - 1):
        while parts[i] in taken or _bad(parts[i], year):
            parts[i] += 1
            parts[-1] -= 1
        taken.add(parts[i])
    if parts[-1] in taken or _bad(parts[-1], year):
        raise _Collision("partition remainder collides")
    taken.add(parts[-1])
    return parts


def _model(s: Structure, rng: random.Random) -> dict[str, float]:
    """Run the company through five years; every value an integer in display units."""
    p = s.profile
    unit = s.scale
    if unit == 1_000:
        revenue = rng.uniform(4e8, 2.5e10) / unit
    else:
        revenue = rng.uniform(7e10, 3.5e11) / unit
    f: dict[str, float] = {}
    r = round
    # Opening balance sheet (offset 5, never shown).
    prev = {
        "cash_total": r(revenue * rng.uniform(0.08, 0.15)),
        "sti": r(revenue * rng.uniform(0.02, 0.06)),
        "ar": r(revenue * _u(rng, p.ar_days) / 365),
        "inv": r(revenue * (1 - p.gross_margin[0]) * _u(rng, p.inv_days) / 365),
        "prepaid": r(revenue * rng.uniform(0.01, 0.03)),
        "ppe": r(revenue * _u(rng, p.ppe)),
        "goodwill": r(revenue * rng.uniform(0.10, 0.30)),
        "intangibles": r(revenue * rng.uniform(0.04, 0.10)),
        "onca": r(revenue * rng.uniform(0.02, 0.05)),
        "ap": r(revenue * (1 - p.gross_margin[0]) * _u(rng, p.ap_days) / 365),
        "accrued": r(revenue * rng.uniform(0.04, 0.07)),
        "accrued_int": r(revenue * rng.uniform(0.001, 0.003)),
        "debt": r(revenue * rng.uniform(0.15, 0.35)),
        "dtl": r(revenue * rng.uniform(0.01, 0.03)),
        "oncl": r(revenue * rng.uniform(0.02, 0.04)),
        "share_capital": r(revenue * rng.uniform(0.10, 0.25)),
        "treasury": -r(revenue * rng.uniform(0.01, 0.05)),
        "aoci": -r(revenue * rng.uniform(0.002, 0.02)),
    }
    assets = sum(
        prev[k]
        for k in (
            "cash_total",
            "sti",
            "ar",
            "inv",
            "prepaid",
            "ppe",
            "goodwill",
            "intangibles",
            "onca",
        )
    )
    liabilities = sum(prev[k] for k in ("ap", "accrued", "accrued_int", "debt", "dtl", "oncl"))
    prev["retained"] = (
        assets - liabilities - prev["share_capital"] - prev["treasury"] - prev["aoci"]
    )
    if prev["retained"] < revenue * 0.05:
        raise _Collision("negative opening retained earnings")
    shares = r(revenue * unit / rng.uniform(40, 120) / unit)  # display units of shares
    prev_ni = revenue * 0.08
    gm = _u(rng, p.gross_margin)
    for off in (4, 3, 2, 1, 0):
        revenue = revenue * (1 + _u(rng, p.growth))
        gm = min(max(gm + rng.uniform(-0.015, 0.015), p.gross_margin[0]), p.gross_margin[1])
        rev = r(revenue)
        cogs = r(rev * (1 - gm))
        sga = r(rev * _u(rng, p.sga))
        rnd = r(rev * _u(rng, p.rnd))
        dep = r(prev["ppe"] * rng.uniform(0.10, 0.16))
        amort = r(prev["intangibles"] * rng.uniform(0.08, 0.15))
        da = dep + amort
        interest = r(prev["debt"] * rng.uniform(0.03, 0.07))
        other = r(rev * rng.uniform(-0.006, 0.008))
        if abs(other) < 120:
            other = 120 + rng.randint(0, 80)
        operating = rev - cogs - sga - rnd - da
        pbt = operating - interest + other
        if pbt <= rev * 0.02:
            raise _Collision("loss-making year")
        tax = r(pbt * rng.uniform(0.19, 0.29))
        ni = pbt - tax
        cur = dict(prev)
        cur["ar"] = r(rev * _u(rng, p.ar_days) / 365)
        cur["inv"] = r(cogs * _u(rng, p.inv_days) / 365)
        cur["prepaid"] = r(rev * rng.uniform(0.01, 0.03))
        cur["ap"] = r(cogs * _u(rng, p.ap_days) / 365)
        cur["accrued"] = r((sga + rnd) * rng.uniform(0.12, 0.20))
        cur["dtl"] = prev["dtl"] + max(r(tax * rng.uniform(-0.08, 0.15)), -prev["dtl"] // 3)
        cur["oncl"] = prev["oncl"] + r(rev * rng.uniform(-0.003, 0.006))
        capex = r(rev * _u(rng, p.capex))
        acquisitions = r(rev * rng.uniform(0.01, 0.06))
        acq_int = r(acquisitions * rng.uniform(0.2, 0.4))
        cur["ppe"] = prev["ppe"] + capex - dep
        cur["intangibles"] = prev["intangibles"] + acq_int - amort
        cur["goodwill"] = prev["goodwill"] + acquisitions - acq_int
        investments = max(r(rev * rng.uniform(-0.01, 0.015)), -prev["sti"] // 3)
        cur["sti"] = prev["sti"] + investments
        other_investing = r(rev * rng.uniform(0.001, 0.006))
        cur["onca"] = prev["onca"] + other_investing
        ebitda = operating + da
        repay = r(prev["debt"] * rng.uniform(0.08, 0.18))
        target = ebitda * _u(rng, p.leverage)
        borrow = max(r(rev * 0.004), r(target - prev["debt"] + repay))
        dividends = r(prev_ni * _u(rng, p.payout))
        issued = r(rev * rng.uniform(0.001, 0.004))
        repurchased = r(rev * rng.uniform(0.003, 0.02))
        fx = r(prev["cash_total"] * rng.uniform(-0.03, 0.03))
        if abs(fx) < 120:
            fx = -(120 + rng.randint(0, 60))
        receipts = rev - (cur["ar"] - prev["ar"])
        payments = (
            cogs
            + sga
            + rnd
            + (cur["inv"] - prev["inv"])
            + (cur["prepaid"] - prev["prepaid"])
            - (cur["ap"] - prev["ap"])
            - (cur["accrued"] - prev["accrued"])
        )
        interest_paid = interest + r(interest * rng.choice((-1, 1)) * rng.uniform(0.01, 0.04))
        cur["accrued_int"] = prev["accrued_int"] + interest - interest_paid
        taxes_paid = tax - (cur["dtl"] - prev["dtl"])
        other_operating = other + (cur["oncl"] - prev["oncl"])
        if abs(other_operating) < 120:
            cur["oncl"] += 150
            other_operating += 150
        ocf = receipts - payments - interest_paid - taxes_paid + other_operating
        icf = -capex - acquisitions - investments - other_investing
        cash = (
            prev["cash_total"] + ocf + icf + borrow - repay - dividends + issued - repurchased + fx
        )
        floor = r(rev * 0.05)
        if cash < floor:
            borrow += floor - cash
            cash = floor
        fcf = borrow - repay - dividends + issued - repurchased
        cur["cash_total"] = cash
        cur["debt"] = prev["debt"] + borrow - repay
        cur["retained"] = prev["retained"] + ni - dividends
        cur["share_capital"] = prev["share_capital"] + issued
        cur["treasury"] = prev["treasury"] - repurchased
        cur["aoci"] = prev["aoci"] + fx
        cur["restricted"] = r(cash * rng.uniform(0.01, 0.04))
        cur["cash"] = cash - cur["restricted"]
        cur["current_debt"] = r(cur["debt"] * rng.uniform(0.05, 0.15))
        cur["ltd"] = cur["debt"] - cur["current_debt"]
        shares = r(shares * rng.uniform(0.97, 1.02))
        diluted = r(shares * rng.uniform(1.005, 1.03))
        row = {
            "is.revenue": rev,
            "is.cogs": cogs,
            "is.gross_profit": rev - cogs,
            "is.sga": sga,
            "is.rnd": rnd,
            "is.da": da,
            "is.operating_income": operating,
            "is.interest": -interest,
            "is.other": other,
            "is.pbt": pbt,
            "is.tax": -tax,
            "is.net_income": ni,
            "is.shares": shares,
            "is.diluted_shares": diluted,
            "cf.receipts": receipts,
            "cf.payments": -payments,
            "cf.interest_paid": -interest_paid,
            "cf.taxes_paid": -taxes_paid,
            "cf.other_operating": other_operating,
            "cf.ocf": ocf,
            "cf.capex": -capex,
            "cf.acquisitions": -acquisitions,
            "cf.investments": -investments,
            "cf.other_investing": -other_investing,
            "cf.icf": icf,
            "cf.borrowings": borrow,
            "cf.repayments": -repay,
            "cf.dividends": -dividends,
            "cf.issued": issued,
            "cf.repurchased": -repurchased,
            "cf.fcf": fcf,
            "cf.fx": fx,
            "cf.net_change": ocf + icf + fcf,
            "cf.begin": prev["cash_total"],
            "cf.end": cash,
            "x.dep": dep,
            "x.amort": amort,
            "x.ebitda": ebitda,
        }
        bs = {
            "bs.cash": cur["cash"],
            "bs.sti": cur["sti"],
            "bs.ar": cur["ar"],
            "bs.inv": cur["inv"],
            "bs.prepaid": cur["prepaid"] + cur["restricted"],
            "bs.ppe": cur["ppe"],
            "bs.goodwill": cur["goodwill"],
            "bs.intangibles": cur["intangibles"],
            "bs.onca": cur["onca"],
            "bs.ap": cur["ap"],
            "bs.accrued": cur["accrued"] + cur["accrued_int"],
            "bs.current_debt": cur["current_debt"],
            "bs.ltd": cur["ltd"],
            "bs.dtl": cur["dtl"],
            "bs.oncl": cur["oncl"],
            "bs.share_capital": cur["share_capital"],
            "bs.treasury": cur["treasury"],
            "bs.retained": cur["retained"],
            "bs.aoci": cur["aoci"],
            "note.restricted": cur["restricted"],
        }
        bs["bs.tca"] = bs["bs.cash"] + bs["bs.sti"] + bs["bs.ar"] + bs["bs.inv"] + bs["bs.prepaid"]
        bs["bs.total_assets"] = (
            bs["bs.tca"] + bs["bs.ppe"] + bs["bs.goodwill"] + bs["bs.intangibles"] + bs["bs.onca"]
        )
        bs["bs.tcl"] = bs["bs.ap"] + bs["bs.accrued"] + bs["bs.current_debt"]
        bs["bs.total_liabilities"] = bs["bs.tcl"] + bs["bs.ltd"] + bs["bs.dtl"] + bs["bs.oncl"]
        bs["bs.total_equity"] = (
            bs["bs.share_capital"] + bs["bs.treasury"] + bs["bs.retained"] + bs["bs.aoci"]
        )
        if bs["bs.total_assets"] != bs["bs.total_liabilities"] + bs["bs.total_equity"]:
            raise AssertionError("the balance sheet does not balance")
        if cur["cash_total"] != prev["cash_total"] + row["cf.net_change"] + fx:
            raise AssertionError("the cash flow does not tie to cash")
        for key, value in {**row, **bs}.items():
            f[f"{key}.{off}"] = value
        prev, prev_ni = cur, ni
    return f


def _build(s: Structure, rng: random.Random) -> dict[str, Fact]:
    f = _model(s, rng)
    facts: dict[str, Fact] = {k: Fact(k, float(v)) for k, v in f.items()}
    y = 0
    taken = {abs(v) for v in f.values()}
    for off in (0, 1):
        ni, shares, diluted = (
            f[f"is.net_income.{off}"],
            f[f"is.shares.{off}"],
            f[f"is.diluted_shares.{off}"],
        )
        facts[f"is.eps.{off}"] = Fact(f"is.eps.{off}", round(ni / shares, 2), 2)
        facts[f"is.eps_diluted.{off}"] = Fact(f"is.eps_diluted.{off}", round(ni / diluted, 2), 2)
    # Dividend per share declared for the year (narrative), two decimals.
    dps = round(-f[f"cf.dividends.{y}"] / f[f"is.shares.{y}"] * rng.uniform(1.0, 1.08), 2)
    facts["nar.dps.0"] = Fact("nar.dps.0", dps, 2)
    # Segments: revenue and operating profit partition the totals, with corporate costs.
    segs = len(s.segments)
    for off in (0, 1):
        revenue = int(f[f"is.revenue.{off}"])
        for i, part in enumerate(_partition(rng, revenue, segs, taken, s.year)):
            facts[f"seg.revenue.{i}.{off}"] = Fact(f"seg.revenue.{i}.{off}", float(part))
        corporate = round(revenue * rng.uniform(0.01, 0.03))
        facts[f"seg.corporate.{off}"] = Fact(f"seg.corporate.{off}", float(-corporate))
        profit = int(f[f"is.operating_income.{off}"]) + corporate
        for i, part in enumerate(_partition(rng, profit, segs, taken, s.year)):
            facts[f"seg.profit.{i}.{off}"] = Fact(f"seg.profit.{i}.{off}", float(part))
        for i, part in enumerate(
            _partition(rng, revenue, len(s.countries), taken, s.year, floor=120)
        ):
            facts[f"geo.{i}.{off}"] = Fact(f"geo.{i}.{off}", float(part))
    # Quarterly revenue and net income of the fiscal year.
    for name, total in (("revenue", f["is.revenue.0"]), ("net_income", f["is.net_income.0"])):
        for q, part in enumerate(_partition(rng, int(total), 4, taken, s.year)):
            facts[f"q.{name}.{q + 1}"] = Fact(f"q.{name}.{q + 1}", float(part))
    # Restatement of the prior year (a footnote shows the figures as previously reported).
    if s.restatement == "reclass":
        moved = round(f["is.cogs.1"] * rng.uniform(0.01, 0.04))
        facts["rs.cogs.1"] = Fact("rs.cogs.1", f["is.cogs.1"] - moved)
        facts["rs.sga.1"] = Fact("rs.sga.1", f["is.sga.1"] + moved)
    else:
        over = round(f["is.revenue.1"] * rng.uniform(0.005, 0.02))
        facts["rs.revenue.1"] = Fact("rs.revenue.1", f["is.revenue.1"] + over)
        facts["rs.net_income.1"] = Fact(
            "rs.net_income.1", f["is.net_income.1"] + round(over * rng.uniform(0.7, 0.8))
        )
    # Narrative operating figures: employees (units) and an order backlog in millions.
    for off in (0, 1):
        base = f[f"is.revenue.{off}"] * s.scale / 1e6
        employees = round(base * _u(rng, s.profile.headcount_per_m) * rng.uniform(0.95, 1.05))
        facts[f"nar.employees.{off}"] = Fact(f"nar.employees.{off}", float(max(employees, 250)))
    backlog = round(f["is.revenue.0"] * s.scale / 1e6 * rng.uniform(0.3, 0.9), 1)
    facts["nar.backlog.0"] = Fact("nar.backlog.0", backlog, 1)
    return facts


def _displayed(s: Structure, facts: dict[str, Fact]) -> dict[str, Fact]:
    """The facts the report shows: statements for two years, history for three more."""
    shown: dict[str, Fact] = {}
    for key, fact in facts.items():
        line, _, off = key.rpartition(".")
        if key.startswith(("is.", "bs.", "cf.")) and off.isdigit() and int(off) >= 2:
            continue
        if key.startswith("x."):
            continue
        if key.startswith("cf.") and line in ("cf.begin", "cf.end") and off != "0":
            continue
        if key.startswith("note.restricted") and off not in ("0", "1"):
            continue
        shown[key] = fact
    # Five-year summary: the three years before the statements.
    for past in (2, 3, 4):
        for row in ("is.revenue", "is.operating_income", "is.net_income", "bs.total_assets"):
            name = row.split(".", 1)[1]
            shown[f"hist.{name}.{past}"] = Fact(f"hist.{name}.{past}", facts[f"{row}.{past}"].value)
    # Gross profit is a shown line of the income statement.
    for past in (0, 1):
        shown[f"is.gross_profit.{past}"] = facts[f"is.gross_profit.{past}"]
    return shown


def _unique(shown: dict[str, Fact], year: int) -> None:
    seen: dict[float, str] = {}
    for key, fact in shown.items():
        magnitude = round(abs(fact.value), fact.decimals)
        if fact.decimals == 0 and (magnitude < 100 or year - 12 <= magnitude <= year + 2):
            raise _Collision(f"{key} = {fact.value} looks like a year or a small label")
        if magnitude in seen:
            raise _Collision(f"{key} and {seen[magnitude]} both show {magnitude}")
        seen[magnitude] = key


def build_accounts(structure_seed: int, value_seed: int, level: int) -> Accounts:
    """The accounts of one document; deterministic in its arguments."""
    s = structure(structure_seed, level)
    for attempt in range(MAX_ATTEMPTS):
        rng = random.Random(sub_seed("values", value_seed, attempt))
        try:
            facts = _build(s, rng)
            shown = _displayed(s, facts)
            _unique(shown, s.year)
        except _Collision:
            continue
        accounts = Accounts(s, value_seed)
        accounts.facts = {**{k: v for k, v in facts.items() if k.startswith("x.")}, **shown}
        return accounts
    raise RuntimeError(f"no unique accounts for seeds {structure_seed}/{value_seed}")


def variant_seed(value_seed: int) -> int:
    """The value seed of the regenerated document the verifier re-runs programs on."""
    return sub_seed("variant", value_seed)
