"""The finance verifier judges numbers by the benchmarks' own rules (issue 37, item 4).

A value is right when it rounds, at the decimals asked, to what the gold rounds to (FinQA:
`round(x, 5)` equality), whatever the program's unrounded result; an imported question's
instruction does not state the unit, so an amount declared `currency` is judged on its value;
large values get float-noise slack only, so a slightly wrong one is wrong. And none of it
lets a unit trick, a hedge or a cheat through.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from palaestra.envs.finance.family import FinanceFamily
from palaestra.envs.finance.imported import imported_numbers
from palaestra.envs.finance.importer import import_file
from palaestra.sdk.task import Task
from palaestra.server.config import Settings
from palaestra.server.inprocess import InProcessClient
from palaestra.server.packs.loader import load_pack
from palaestra.verifiers import finance as vf

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FINQA_PROGRAM = "subtract(5829, 5735), divide(#0, 5735)"  # 94 / 5735 = 0.0163905...
DOC = vf.Numbers(figures={"a": 5829.0, "b": 5735.0, "c": 1234567.0, "d": 1234000.0})


def finqa_gold(value: float, program: str) -> vf.Gold:
    """A gold as the FinQA importer writes it: FinQA's rounded result, unit not stated."""
    return vf.Gold(
        kind="ratio", value=value, decimals=5, scale="units", program=program, unit_stated=False
    )


def reward(gold: vf.Gold, value: float, unit: str = "ratio", scale: str = "units") -> float:
    answer = vf.Answer.model_validate(
        {"value": value, "unit": unit, "scale": scale, "program": gold.program}
    )
    return vf.grade(answer, gold, DOC).reward


def test_a_value_at_finqas_rounding_is_right_whatever_the_unrounded_result() -> None:
    gold = finqa_gold(0.01639, FINQA_PROGRAM)
    assert reward(gold, 0.01639) == 1.0
    assert reward(gold, 94 / 5735) == 1.0  # the program's unrounded result
    # Rounds to 0.01639 as FinQA rounds; 5.5e-6 from the program's result (it was 0.05:
    # the program had to be within half a unit of the submitted value).
    assert reward(gold, 0.0163851) == 1.0
    assert reward(gold, 0.016396) == 0.0  # rounds to 0.0164
    assert reward(gold, 0.01638) == 0.0
    assert reward(gold, 1.639, "percent") == 1.0  # 1.639 % is 0.01639


def test_rounding_is_centred_on_the_gold_rounding_not_the_unrounded_gold() -> None:
    """A generated question keeps its unrounded gold: 12.3449 % asked to 1 decimal is 12.3."""
    doc = vf.Numbers(figures={"a": 123449.0, "b": 1000000.0})
    gold = vf.Gold(
        kind="percent", value=0.123449, decimals=1, scale="units", program="divide(123449, 1000000)"
    )

    def graded(value: float) -> float:
        answer = vf.Answer(value=value, unit="percent", program=gold.program)
        return vf.grade(answer, gold, doc).reward

    assert graded(12.3) == graded(12.3449) == 1.0
    assert graded(12.26) == 1.0  # rounds to 12.3 (it was 0: 0.085 from 12.3449)
    assert graded(12.39) == 0.0  # rounds to 12.4 (it was 1.0: 0.045 from 12.3449)
    tie = vf.Gold(
        kind="percent", value=0.1235, decimals=1, scale="units", program="divide(1235, 10000)"
    )
    tie_doc = vf.Numbers(figures={"a": 1235.0, "b": 10000.0})
    for value, right in [(12.3, True), (12.4, True), (12.2, False), (12.5, False)]:
        answer = vf.Answer(value=value, unit="percent", program=tie.program)
        assert vf.grade(answer, tie, tie_doc).passed is right, value  # either rule on a tie


def test_money_declared_currency_is_judged_on_its_value_where_no_unit_is_stated() -> None:
    gold = finqa_gold(5782.0, "add(5829, 5735), divide(#0, const_2)")
    for unit in ("currency", "ratio", "count", "shares", "currency_per_share", "fraction"):
        assert reward(gold, 5782.0, unit) == 1.0, unit  # currency scored 0 before
    assert reward(gold, 5.782, "currency", "thousands") == 1.0  # the same amount, said so
    assert reward(gold, 5782.0, "currency", "thousands") == 0.0  # the digits, another scale
    assert reward(gold, 5782.0, "percent") == 0.0  # 57.82: percent keeps its meaning
    # Where the instruction states the unit (a generated question), the dimension counts.
    stated = vf.Gold(kind="ratio", value=5782.0, decimals=2, scale="units", program=gold.program)
    assert reward(stated, 5782.0, "currency") == 0.0
    assert reward(stated, 5782.0, "ratio") == 1.0
    # An unstated percentage is still a percentage: its digits as an amount are wrong.
    percent = vf.Gold(
        kind="percent", value=0.01639, decimals=2, scale="units", program=FINQA_PROGRAM,
        unit_stated=False,
    )  # fmt: skip
    assert reward(percent, 1.64, "percent") == 1.0
    assert reward(percent, 0.0164, "fraction") == 1.0
    assert reward(percent, 1.64, "currency") == reward(percent, 0.0164, "currency") == 0.0


def test_large_values_are_compared_without_slack_beyond_float_noise() -> None:
    gold = finqa_gold(1234567.0, "add(1234567, 5735), subtract(#0, 5735)")
    assert reward(gold, 1234567.0, "currency") == 1.0
    assert reward(gold, 1234567.0000001, "currency") == 1.0  # float noise
    assert reward(gold, 1234567.00002, "currency") == 0.0  # off at the fifth decimal
    assert reward(gold, 1234000.0, "currency") == 0.0
    near = finqa_gold(1234000.0, "add(1234000, 5735), subtract(#0, 5735)")
    assert reward(near, 1234567.0, "currency") == 0.0
    assert reward(near, 1234001.0, "currency") == 0.0
    # An equivalent program in another order: the float noise of a 1e11 value passes.
    big = vf.Numbers(figures={"x": 98765432109.87654, "y": 24691357902.46913, "z": 3.0})
    exact = (98765432109.87654 + 24691357902.46913) / 3.0
    gold = finqa_gold(round(exact, 5), "add(98765432109.87654, 24691357902.46913), divide(#0, 3)")
    other = "divide(98765432109.87654, 3), divide(24691357902.46913, 3), add(#0, #1)"
    answer = vf.Answer(value=exact, unit="currency", program=other)
    assert vf.grade(answer, gold, big).passed
    assert not vf.grade(answer.model_copy(update={"value": exact + 1.0}), gold, big).passed


def test_a_yes_no_answer_is_one_or_zero_not_a_hedge() -> None:
    gold = vf.Gold(
        kind="ratio", value=1.0, decimals=0, scale="units", program="greater(5829, 5735)",
        unit_stated=False,
    )  # fmt: skip
    assert reward(gold, 1.0) == 1.0
    assert reward(gold, 0.5) == 0.0  # half-way rounded to both yes and no: it paid 1.0
    assert reward(gold, 0.0) == 0.0


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> list[Task]:
    out = tmp_path_factory.mktemp("packs")
    tasks = []
    for name, fixture in [("f", "finqa/finqa.json"), ("t", "tatqa-real/tatqa_dev_sample.json")]:
        import_file(FIXTURES / fixture, out / name, f"acme/{name}")
        tasks += load_pack(out / name).tasks.values()
    return tasks


def test_imported_golds_say_the_unit_is_not_stated_and_the_instruction_says_how(
    imported: list[Task],
) -> None:
    numeric = [t for t in imported if t.private["gold"]["kind"] != "text"]
    assert numeric and all(t.private["gold"]["unit_stated"] is False for t in numeric)
    priced = [t for t in numeric if "decimals" in t.public["instruction"]]  # not yes/no
    assert any("checked at 5 decimals" in t.public["instruction"] for t in priced)
    assert any("checked at 2 decimals" in t.public["instruction"] for t in priced)
    assert all("currency or ratio alike" in t.public["instruction"] for t in priced)


def test_every_cheat_stays_under_the_floor_with_the_looser_rules(imported: list[Task]) -> None:
    """Unit relabels, wrong scales, guesses and the program cheats on every imported
    question, graded with the unit unstated (as now) and stated (as before)."""
    family = FinanceFamily()
    seen: set[str] = set()
    for task in imported:
        gold_json = task.private["gold"]
        if gold_json["kind"] == "text":
            continue
        numbers = imported_numbers(*family.public_fields.of(task).imported())
        question = task.public["question"]
        gold = vf.Gold.from_json(gold_json)
        golds = [gold, dataclasses.replace(gold, unit_stated=True)]
        oracle = vf.Answer(**family.oracle(task)[0].arguments)
        for gold in golds:
            assert vf.grade(oracle, gold, numbers, None, question).reward == 1.0
        for name, actions in family.cheats(task):
            if actions[0].tool != "submit":
                continue
            seen.add(name)
            answer = vf.Answer(**actions[0].arguments)
            for gold in golds:
                graded = vf.grade(answer, gold, numbers, None, question)
                assert graded.reward <= vf.VALUE_ONLY_REWARD, (task.id, name, graded.feedback)
    assert {"unit-relabel", "wrong-scale", "percent-as-ratio", "fraction-as-percent"} <= seen


def test_a_pack_imported_before_2_1_judges_currency_on_its_value_in_an_episode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its golds lack `unit_stated`; the family reads every imported document as unstated."""
    packs = tmp_path / "packs"
    import_file(FIXTURES / "finqa" / "finqa.json", packs / "finqa", "acme/finqa")
    lines = (packs / "finqa" / "tasks.jsonl").read_text().splitlines()
    old = []
    for line in lines:
        task = json.loads(line)
        task["private"]["gold"].pop("unit_stated", None)
        old.append(json.dumps(task))
    (packs / "finqa" / "tasks.jsonl").write_text("\n".join(old) + "\n")
    monkeypatch.setenv("PALAESTRA_CACHE", str(tmp_path / "cache"))
    settings = Settings(data_dir=tmp_path / "data", packs_dirs=[packs], cache=tmp_path / "cache")
    ref = "acme/finqa@1.0.0:ACME-2019-page_41.pdf-2"  # table_average(sales, none) = 1367.5
    with InProcessClient(settings) as client:
        for unit, value, expected in [("currency", 1367.5, 1.0), ("percent", 1367.5, 0.0)]:
            eid = client.reset(ref).episode_id
            arguments = {"value": value, "unit": unit, "program": "table_average(sales, none)"}
            reply = client.step(eid, {"tool": "submit", "arguments": arguments})
            assert reply.terminated and reply.reward == expected, (unit, reply.info)
