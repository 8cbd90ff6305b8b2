"""The finance family: consistent accounts, a faithful PDF, gold programs at 1.0, cheats at 0.

The 200-per-domain check grades the gold answer and every cheat with the same verifier the
family uses, against the generated accounts in-process (fast); the episode tests go through
the real PDF, parsed with pdfplumber, and the in-process client of a real manager.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import ServerProcess

from palaestra.envs.finance.accounts import build_accounts, structure
from palaestra.envs.finance.document import numbers_in, parse_number, parse_pdf
from palaestra.envs.finance.family import FinanceFamily, variant_of
from palaestra.envs.finance.layout import build_layout
from palaestra.envs.finance.questions import DOMAINS
from palaestra.envs.finance.report import render
from palaestra.envs.finance.tasks import _generate, build_document
from palaestra.sdk.task import Task
from palaestra.server.config import Settings
from palaestra.server.inprocess import InProcessClient
from palaestra.server.packcheck import check_pack
from palaestra.verifiers import finance as vf

PACK = Path(__file__).resolve().parents[3] / "packs" / "finance"
PER_DOMAIN = 200


def as_task(raw: dict[str, Any], split: str = "train") -> Task:
    return Task(
        id=raw["id"],
        family="finance",
        domain=raw["domain"],
        split=split,
        pack="palaestra/finance",
        version="1.0.0",
        public=raw["public"],
        private=raw["private"],
        difficulty=raw["difficulty"],
        sealed=False,
        digest=Task.compute_digest("finance", raw["domain"], raw["public"], raw["private"]),
    )


def numbers_for(task: Task) -> vf.Numbers:
    spec = task.private["document"]
    return build_document(spec["structure_seed"], spec["value_seed"], spec["level"]).numbers


def grade(task: Task, arguments: dict[str, Any]) -> vf.Grade:
    gold = vf.Gold.from_json(task.private["gold"])
    numbers, question = numbers_for(task), task.public["question"]
    return vf.grade(vf.Answer(**arguments), gold, numbers, variant_of(task, gold), question)


# -- accounts ---------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(12))
def test_three_statements_tie(seed: int) -> None:
    a = build_accounts(seed, seed * 31 + 7, 1 + seed % 3)
    for off in (0, 1):
        f = {k.rsplit(".", 1)[0]: v.value for k, v in a.facts.items() if k.endswith(f".{off}")}
        assert f["is.gross_profit"] == f["is.revenue"] - f["is.cogs"]
        assert f["is.net_income"] == (
            f["is.operating_income"] + f["is.interest"] + f["is.other"] + f["is.tax"]
        )
        assert f["bs.total_assets"] == f["bs.total_liabilities"] + f["bs.total_equity"]
        assert f["cf.net_change"] == f["cf.ocf"] + f["cf.icf"] + f["cf.fcf"]
        # Indirect check of the direct method: operating cash flow from net income.
        assert (
            f["cf.ocf"]
            == f["cf.receipts"]
            + f["cf.payments"]
            + f["cf.interest_paid"]
            + f["cf.taxes_paid"]
            + f["cf.other_operating"]
        )
        segments = sum(
            v.value
            for k, v in a.facts.items()
            if k.startswith("seg.revenue.") and k.endswith(f".{off}")
        )
        assert segments == f["is.revenue"]
        profits = sum(
            v.value
            for k, v in a.facts.items()
            if k.startswith("seg.profit.") and k.endswith(f".{off}")
        )
        assert profits + f["seg.corporate"] == f["is.operating_income"]
    f0 = {k[:-2]: v.value for k, v in a.facts.items() if k.endswith(".0")}
    # Cash at the end = beginning + net change + exchange rates = balance sheet cash + restricted.
    assert f0["cf.end"] == f0["cf.begin"] + f0["cf.net_change"] + f0["cf.fx"]
    assert f0["cf.end"] == f0["bs.cash"] + f0["note.restricted"]
    assert a["bs.retained.0"] == a["bs.retained.1"] + a["is.net_income.0"] + a["cf.dividends.0"]
    assert sum(a[f"q.revenue.{q}"] for q in (1, 2, 3, 4)) == a["is.revenue.0"]


def test_regeneration_keeps_the_layout_and_changes_the_numbers() -> None:
    a = build_document(3, 100, 2)
    b = build_document(3, 200, 2)
    assert a.layout.figures.keys() == b.layout.figures.keys()
    changed = sum(a.numbers.figures[k] != b.numbers.figures[k] for k in a.numbers.figures)
    assert changed > 0.9 * len(a.numbers.figures)
    # The prose does not change the figures.
    full = build_layout(build_accounts(3, 100, 2), text=True)
    assert {k: f.text for k, f in full.figures.items()} == {
        k: f.text for k, f in a.layout.figures.items()
    }


def test_profiles_and_styles_vary() -> None:
    seen = {(structure(s, 2).profile.name, structure(s, 2).style.name) for s in range(60)}
    assert len({p for p, _ in seen}) >= 4 and len({s for _, s in seen}) >= 3


# -- the 200-per-domain check ----------------------------------------------------------------
@pytest.mark.parametrize("domain", DOMAINS)
def test_gold_scores_one_and_every_cheat_zero(domain: str) -> None:
    cheats_seen: set[str] = set()
    for i in range(PER_DOMAIN):
        task = as_task(_generate(50_000 + i, 1 + i % 3, domain))
        gold = vf.Gold.from_json(task.private["gold"])
        numbers = numbers_for(task)
        variant = variant_of(task, gold)
        assert variant is not None
        oracle = FinanceFamily().oracle(task)[0].arguments
        verdict = vf.grade(vf.Answer(**oracle), gold, numbers, variant)
        assert verdict.reward == 1.0, (task.id, verdict.feedback)
        question = task.public["question"]
        for name, actions in FinanceFamily().cheats(task):
            cheats_seen.add(name)
            answer = vf.Answer(**actions[0].arguments)
            result = vf.grade(answer, gold, numbers, variant, question)
            # The value may be right (a program cheat): then only VALUE_ONLY_REWARD is paid.
            assert result.reward <= vf.VALUE_ONLY_REWARD, (task.id, name, result.feedback)
            if result.reward > 0:
                assert result.components["program"] == 0.0, (task.id, name, result.feedback)
    assert {"wrong-scale", "invented-operands", "copy-question-number", "prior-year"} <= cheats_seen
    assert {"constants-only", "figure-plus-constants", "zeroed-operands"} <= cheats_seen


def test_cheat_kinds() -> None:
    """Each cheat of the issue, named: right digits wrong scale, copied number, invented
    operands, a fraction for a percentage, the prior-year figure."""
    task = as_task(_generate(7, 1, "growth"))
    gold = vf.Gold.from_json(task.private["gold"])
    assert gold.unit == "percent"
    right = {
        "value": gold.asked_value,
        "unit": "percent",
        "scale": "units",
        "program": gold.program,
    }
    assert grade(task, right).reward == 1.0
    assert grade(task, {**right, "scale": "thousands"}).reward == 0.0
    assert grade(task, {**right, "value": gold.value}).reward == 0.0  # a fraction as percent
    said_so = {**right, "value": gold.value, "unit": "fraction"}
    assert grade(task, said_so).reward == 1.0  # a fraction that says so is fine
    year = int(re.findall(r"\d{4}", task.public["question"])[0])
    assert grade(task, {**right, "value": year, "program": str(year)}).reward == 0.0
    invented = grade(task, {**right, "program": f"add({gold.asked_value}, const_0)"})
    assert invented.reward == vf.VALUE_ONLY_REWARD and "not in the document" in invented.feedback
    prior = task.private["prior"]
    assert grade(task, {**right, "value": prior["value"], "program": prior["program"]}).reward == 0


def test_memorised_constants_lose_the_program() -> None:
    """A program that gives this document's answer from constants fails the re-run."""
    task = as_task(_generate(11, 1, "margins"))
    gold = vf.Gold.from_json(task.private["gold"])
    numbers = numbers_for(task)
    operand = next(iter(re.findall(r"\d+(?:\.\d+)?", gold.program)))
    # operand / operand * answer: every operand is in the document, but the answer is fixed.
    asked = gold.asked_value
    program = f"divide({operand}, {operand}), multiply(#0, const_100)"
    scale = asked / 100
    text = f"{program}, multiply(#1, {scale!r})"
    with_constant = grade(
        task, {"value": asked, "unit": "percent", "scale": "units", "program": text}
    )
    assert with_constant.reward == vf.VALUE_ONLY_REWARD  # the constant is an invented operand
    assert with_constant.components["program"] == 0.0
    # The same-valued cells of another year are in the document: right now, wrong on re-run.
    digits = [t for t in numbers_in(gold.program)]
    assert digits
    ok = vf.grade(vf.Answer(value=asked, unit="percent", program=gold.program), gold, numbers, None)
    assert ok.reward == 1.0
    swapped = vf.Numbers(figures={k: -v * 1.01 for k, v in numbers.figures.items()})
    wrong_variant = vf.grade(
        vf.Answer(value=asked, unit="percent", program=gold.program),
        gold,
        numbers,
        (swapped, gold.value * 3),
    )
    assert wrong_variant.reward == vf.VALUE_ONLY_REWARD
    assert wrong_variant.components["grounded"] == 0.0
    assert wrong_variant.components["program"] == 0.0


def test_tolerance_follows_the_decimals_asked() -> None:
    gold = vf.Gold(
        kind="money", value=1_234_567_000.0, decimals=1, scale="millions", program="1234567"
    )
    numbers = vf.Numbers(figures={"a": 1234567.0})

    def reward(value: float, scale: str = "millions") -> float:
        answer = vf.Answer(
            value=value,
            unit="currency",
            scale=scale,  # type: ignore[arg-type]
            program="divide(1234567, const_1000)",
        )
        return vf.grade(answer, gold, numbers).reward

    assert reward(1234.6) == 1.0
    assert reward(1234.55) == 1.0  # within half a unit of the first decimal
    assert reward(1234.5) == 0.0
    assert reward(1234.7) == 0.0
    assert reward(1234567, "thousands") == 1.0  # another scale, said so
    assert reward(1234.6, "thousands") == 0.0  # right digits, wrong scale
    signed = vf.Gold(
        kind="money", value=-5_000.0, decimals=0, scale="thousands", program="subtract(1000, 6000)"
    )
    nums = vf.Numbers(figures={"a": 1000.0, "b": -6000.0})
    answer = vf.Answer(value=-5, unit="currency", scale="thousands", program="subtract(1000, 6000)")
    assert vf.grade(answer, signed, nums).reward == 1.0
    flipped = answer.model_copy(update={"value": 5.0, "program": "subtract(6000, 1000)"})
    assert vf.grade(flipped, signed, nums).reward == 0.0  # sign conventions count


# -- the real PDF -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def long_report() -> Iterator[tuple[Any, bytes, Any]]:
    built = build_document(5, 77, 3, text=True)
    pdf = render(built.layout, built.accounts.structure.style)
    yield built, pdf, parse_pdf(pdf)


def test_long_report_prints_every_figure_once(long_report: Any) -> None:
    built, _, parsed = long_report
    assert len(parsed.pages) >= 20
    assert any(p.two_column for p in parsed.pages)
    assert sum(len(p.tables) for p in parsed.pages) >= 8
    years = {float(y) for y in built.layout.years}
    printed: dict[float, int] = {}
    for page in parsed.pages:
        for line in page.lines:
            for token in numbers_in(line):
                value = parse_number(token)
                assert value is not None
                if "," in token or "." in token or abs(value) >= 100:
                    key = round(abs(value), 6)
                    printed[key] = printed.get(key, 0) + 1
    for key, figure in built.layout.figures.items():
        assert printed.get(round(abs(figure.value), 6)) == 1, (key, figure.text)
    extra = {v for v in printed if v not in years} - {
        round(abs(f.value), 6) for f in built.layout.figures.values()
    }
    assert not extra, sorted(extra)[:10]  # nothing else looks like a figure


def test_tables_and_columns_are_read(long_report: Any) -> None:
    built, _, parsed = long_report
    y = built.accounts.structure.year
    tables = [t for p in parsed.pages for t in p.tables]
    revenue = built.layout.figures["is.revenue.0"].text
    rows = [row for t in tables for row in t if row and row[0] == "Revenue" and revenue in row]
    assert len(rows) == 1
    countries = set(built.accounts.structure.countries)
    found = {r[0] for p in parsed.pages for t in p.tables for r in t if r and r[0] in countries}
    assert found == countries  # the long country table, across its pages
    # Two-column pages read the left column first: a narrative sentence is not cut in two.
    text = "\n".join(p.text for p in parsed.pages if p.two_column)
    employees = built.layout.figures["nar.employees.0"].text
    assert re.search(rf"employed\s+{re.escape(employees)}\s+people", text.replace("\n", " "))
    assert str(y) in text


# -- episodes through the in-process client --------------------------------------------------
@pytest.fixture(scope="module")
def finance_env(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A packs dir with only this pack, and a cache dir shared by the module's servers."""
    tmp = tmp_path_factory.mktemp("finance")
    packs = tmp / "packs"
    packs.mkdir()
    (packs / "finance").symlink_to(PACK)  # only this pack, not every built-in one
    return packs, tmp / "cache"


@pytest.fixture(scope="module")
def client(finance_env: tuple[Path, Path]) -> Iterator[InProcessClient]:
    packs, cache = finance_env
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PALAESTRA_CACHE", str(cache))
        settings = Settings(data_dir=cache.parent / "data", packs_dirs=[packs], cache=cache)
        with InProcessClient(settings) as c:
            yield c


def _first_task(client: InProcessClient, domain: str, level: str) -> str:
    listing = client.tasks(pack="palaestra/finance", split="train", domain=f"finance/{domain}")
    for info in listing.tasks:
        if info.difficulty == level:
            return info.id if ":" in info.id else f"palaestra/finance@1.0.0:{info.id}"
    raise AssertionError(f"no {domain} {level} task")


def test_episode_tools_and_bad_input(client: InProcessClient) -> None:
    ref = _first_task(client, "liquidity", "level-1")
    reset = client.reset(ref)
    assert {t.name for t in reset.tools} >= {
        "list_pages",
        "read_page",
        "extract_tables",
        "search",
        "page_image",
        "calculate",
        "submit",
    }
    eid = reset.episode_id
    pages = reset.observation.data["pages"]
    listing = client.step(eid, {"tool": "list_pages", "arguments": {}})
    assert f"page {pages}:" in listing.observation.text
    hits = client.step(eid, {"tool": "search", "arguments": {"text": "Total current assets"}})
    page = int(re.search(r"page (\d+):", hits.observation.text).group(1))  # type: ignore[union-attr]
    tables = client.step(eid, {"tool": "extract_tables", "arguments": {"page": page}})
    cells = {r[0]: r[1:] for t in tables.observation.data["tables"] for r in t if r}
    tca, tcl = cells["Total current assets"][-2], cells["Total current liabilities"][-2]
    program = f"divide({tca.replace(',', '')}, {tcl.replace(',', '')})"
    calc = client.step(eid, {"tool": "calculate", "arguments": {"program": program}})
    result = calc.observation.data["result"]
    assert "not printed" not in calc.observation.text
    invented = client.step(eid, {"tool": "calculate", "arguments": {"program": "add(1.2345, 1)"}})
    assert "not printed in the report: 1.2345" in invented.observation.text
    # Bad input: an observation, and the episode goes on.
    for action, expect in [
        ({"tool": "calculate", "arguments": {"program": "divide(5, "}}, "program error"),
        ({"tool": "calculate", "arguments": {"program": "divide(5, const_0)"}}, "division by zero"),
        ({"tool": "calculate", "arguments": {"program": "frobnicate(1, 2)"}}, "unknown operation"),
        ({"tool": "read_page", "arguments": {"page": 999}}, "does not exist"),
        ({"tool": "extract_tables", "arguments": {"page": 0}}, "does not exist"),
    ]:
        reply = client.step(eid, action)
        assert expect in reply.observation.text and not reply.terminated
    image = client.step(eid, {"tool": "page_image", "arguments": {"page": 1}})
    assert base64.b64decode(image.observation.images[0])[:8] == b"\x89PNG\r\n\x1a\n"
    text = client.step(eid, {"tool": "read_page", "arguments": {"page": page}}).observation.text
    assert "Total current assets" in text
    final = client.step(
        eid,
        {
            "tool": "submit",
            "arguments": {
                "value": round(result, 2),
                "unit": "ratio",
                "scale": "units",
                "program": program,
            },
        },
    )
    assert final.terminated and final.reward == 1.0, final.info


def test_oracle_null_and_cheats_through_episodes(client: InProcessClient) -> None:
    ref = _first_task(client, "restatement", "level-1")
    family = FinanceFamily()
    task = client.manager.packs.resolve(ref)
    runs = [("oracle", family.oracle(task)), ("null", family.null(task)), *family.cheats(task)]
    for name, actions in runs:
        eid = client.reset(ref).episode_id
        reply = client.step(eid, actions[0])
        assert reply.terminated
        if name == "oracle":
            assert reply.reward == 1.0, reply.info
        elif name == "null":
            assert reply.reward == 0.0, reply.info
        else:  # a right value with a program that is not the computation: VALUE_ONLY_REWARD
            assert reply.reward in (0.0, vf.VALUE_ONLY_REWARD), (name, reply.info)


@pytest.mark.slow
def test_pack_check_passes() -> None:
    report = __import__("asyncio").run(check_pack(PACK, limit=2, concurrency=2))
    assert report.ok, [(p.where, p.check, p.message) for p in report.problems]
    assert report.tasks == 180 and report.checked == 2


@pytest.mark.parametrize("ruled", [True, False])
def test_statement_tables_in_both_table_styles(ruled: bool) -> None:
    seed = next(s for s in range(100) if structure(s, 1).style.ruled is ruled)
    built = build_document(seed, 5, 1, text=True)
    pdf = render(built.layout, built.accounts.structure.style)
    assert pdf == render(built.layout, built.accounts.structure.style)  # deterministic bytes
    parsed = parse_pdf(pdf)
    y = built.accounts.structure.year
    figures = built.layout.figures
    for line, label in (
        ("is.revenue", "Revenue"),
        ("bs.total_assets", "Total assets"),
        ("cf.ocf", "Net cash from operating activities"),
    ):
        expected = [label, figures[f"{line}.0"].text, figures[f"{line}.1"].text]
        tables = [t for p in parsed.pages for t in p.tables if expected in t]
        assert tables, (label, ruled)
        assert str(y) in tables[0][0][1]  # the header row names the years


def test_row_labels_in_programs() -> None:
    built = build_document(9, 21, 2)
    s = built.accounts.structure
    name = s.countries[0]
    total = sum(abs(built.numbers.figures[f"geo.0.{off}"]) for off in (0, 1))
    gold = vf.Gold(
        kind="ratio", value=total, decimals=0, scale="units", program=f"table_sum({name}, none)"
    )
    answer = vf.Answer(value=total, unit="ratio", program=f"table_sum({name}, none)")
    assert vf.grade(answer, gold, built.numbers).reward == 1.0
    ambiguous = vf.Answer(value=total, unit="ratio", program="table_sum(Revenue, none)")
    graded = vf.grade(ambiguous, gold, built.numbers)
    assert graded.components["program"] == 0.0 and "write the numbers instead" in graded.feedback
    assert graded.reward == vf.VALUE_ONLY_REWARD  # the value is right, the program is not


def test_episode_over_http(tmp_path: Path, finance_env: tuple[Path, Path]) -> None:
    """A real server on loopback: the PDF's tables over HTTP, a program built from them."""
    packs, cache = finance_env  # the task cache and the PDF parse are warm from above
    env = {"PALAESTRA_PACKS_DIRS": str(packs), "PALAESTRA_CACHE": str(cache)}
    server = ServerProcess(tmp_path / "data", extra_env=env).start()
    try:
        with server.client() as http:
            listing = http.tasks(pack="palaestra/finance", domain="finance/liquidity")
            info = next(t for t in listing.tasks if t.difficulty == "level-1")
            ref = info.id if ":" in info.id else f"palaestra/finance@1.0.0:{info.id}"
            eid = http.reset(ref).episode_id
            hits = http.step(eid, {"tool": "search", "arguments": {"text": "Total current"}})
            page = int(hits.observation.text.split(":")[0].removeprefix("page "))
            tables = http.step(eid, {"tool": "extract_tables", "arguments": {"page": page}})
            cells = {r[0]: r[1:] for t in tables.observation.data["tables"] for r in t if r}
            assets = cells["Total current assets"][-2].replace(",", "")
            liabilities = cells["Total current liabilities"][-2].replace(",", "")
            program = f"divide({assets}, {liabilities})"
            value = round(float(assets) / float(liabilities), 2)
            bad = http.step(eid, {"tool": "read_page", "arguments": {"page": 10_000}})
            assert "does not exist" in bad.observation.text and not bad.terminated
            final = http.step(
                eid,
                {
                    "tool": "submit",
                    "arguments": {
                        "value": value,
                        "unit": "ratio",
                        "scale": "units",
                        "program": program,
                    },
                },
            )
            assert final.terminated and final.reward == 1.0, final.info
    finally:
        server.stop()
