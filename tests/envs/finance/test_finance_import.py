"""`palaestra pack import finqa`: FinQA and TAT-QA questions become a finance pack that checks.

Real TAT-QA data (tests/fixtures/tatqa-real, CC BY 4.0) and hand-made FinQA entries in
FinQA's format (tests/fixtures/finqa: FinQA's data files are not reachable here).
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from palaestra.cli.main import app
from palaestra.envs.finance import derivation as dv
from palaestra.envs.finance.family import FinanceFamily
from palaestra.envs.finance.finqa_exec import InvalidProgram, execute
from palaestra.envs.finance.imported import imported_numbers
from palaestra.envs.finance.importer import ImportProblem, import_file
from palaestra.server.packcheck import check_pack
from palaestra.server.packs.loader import load_pack
from palaestra.verifiers import finance as vf
from palaestra.verifiers import finance_text as ft

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
FINQA = FIXTURES / "finqa" / "finqa.json"
TATQA = FIXTURES / "tatqa-real" / "tatqa_dev_sample.json"
TABLE = [
    ["", "2019", "2018"],
    ["net revenue", "$ 5,829", "$ 5735 ( 2% )"],
    ["loss", "( 71 )", "-3"],
]


# -- FinQA's execution ---------------------------------------------------------------------------
def test_finqa_programs_run_as_finqas_evaluator_runs_them() -> None:
    assert execute("subtract(5829, 5735), divide(#0, 5735)", TABLE) == 0.01639
    assert execute("subtract(21.5%, 24%), multiply(#0, const_100)", TABLE) == -2.5
    assert execute("multiply(3, const_m1)", TABLE) == -3.0
    assert execute("add(412, 388), divide(#0, 3)", TABLE) == 266.66667  # a literal divisor
    assert execute("greater(5829, 5735)", TABLE) == "yes"
    assert execute("greater(5735, 5829)", TABLE) == "no"
    # a row: `$` and separators dropped, everything from "(" cut
    assert execute("table_average(net revenue, none)", TABLE) == 5782.0
    assert execute("exp(1.1, const_2)", TABLE) == 1.21
    for bad, why in [
        ("frobnicate(1, 2)", "not op"),
        ("divide(1, const_0)", "division"),
        ("greater(2, 1), add(#0, 1)", "yes/no"),
        ("table_sum(loss, none)", "not a number"),  # "( 71 )" is empty before "("
        ("table_sum(profit, none)", "no table row"),
        ("add(#3, 1)", "no earlier step"),
    ]:
        with pytest.raises(InvalidProgram, match=why):
            execute(bad, TABLE)


# -- TAT-QA's derivations ------------------------------------------------------------------------
def programs(derivation: str) -> list[str]:
    return [program for _, program in dv.programs(derivation)]


def test_derivations_become_programs_under_each_reading() -> None:
    assert programs("72,414 - 68,911") == ["subtract(72414, 68911)"]
    assert programs("(5,829 - 5,735) / 5,735 * 100%") == [
        "subtract(5829, 5735), divide(#0, 5735), multiply(#1, const_1)",
        "subtract(5829, 5735), divide(#0, 5735), multiply(#1, const_100)",
    ]
    # an accounting negative, or grouping parentheses: the answer decides
    assert programs("(71) + 12") == ["add(71, 12)", "add(-71, 12)"]
    assert programs("-114 - (71)") == ["subtract(-114, 71)", "subtract(-114, -71)"]
    assert programs("-(3 + 4)") == ["add(3, 4), multiply(#0, const_m1)"]
    assert programs("[(166+178)/2] - [(57+44)/2]") == [
        "add(166, 178), divide(#0, 2), add(57, 44), divide(#2, 2), subtract(#1, #3)"
    ]
    assert programs("$ 90,963-$ 84,886") == ["subtract(90963, 84886)"]
    assert programs("1,027/11%") == ["divide(1027, 11%)", "divide(1027, 11)"]
    assert programs("60.3 million + 32,137 thousand") == [
        "multiply(60.3, const_1000000), multiply(32137, const_1000), add(#0, #1)"
    ]
    assert programs("5,829") == ["5829"]
    for bad in ("max(1, 2)", "(1 + 2", "1 +", ""):
        with pytest.raises(dv.DerivationError):
            programs(bad)


# -- TAT-QA's normalisation ----------------------------------------------------------------------
def test_text_answers_score_by_tatqas_exact_match() -> None:
    assert ft.score(["$1,496.5"], "million", ["$1,496.5"], "million").exact
    assert ft.score(["1496.5"], "million", ["$1,496.5"], "million").exact
    assert not ft.score(["1496.5"], "", ["$1,496.5"], "million").exact  # scale counts
    assert ft.score(["B", "a"], "", ["A", "b."], "").exact  # a list in any order
    assert ft.score(["The Annual basis"], "", ["annual basis"], "").exact
    assert not ft.score(["0.5"], "", ["50"], "percent").exact  # 0.5 for 50 % does not pass
    partial = ft.score(["annual basis and more words"], "", ["annual basis"], "")
    assert not partial.exact and 0 < partial.f1 < 1  # F1 is reported, not paid


# -- import, check ---------------------------------------------------------------------------------
def tasks_of(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "tasks.jsonl").read_text().splitlines()]


def test_real_tatqa_sample_imports_whole_and_checks(tmp_path: Path) -> None:
    out = tmp_path / "pack"
    report = import_file(TATQA, out, "acme/tatqa")
    questions = sum(len(e["questions"]) for e in json.loads(TATQA.read_text()))
    assert len(report.imported) == questions == 36 and not report.skipped
    kinds = {t["private"]["gold"]["kind"] for t in tasks_of(out)}
    assert kinds == {"text", "money", "percent", "ratio"}
    saved = json.loads((out / "import-report.json").read_text())
    assert len(saved["imported"]) == 36 and saved["skipped"] == []
    checked = asyncio.run(check_pack(out))
    assert checked.ok, [(p.where, p.check, p.message) for p in checked.problems]


def test_finqa_entries_import_with_their_executed_gold(tmp_path: Path) -> None:
    out = tmp_path / "pack"
    report = import_file(FINQA, out, "acme/finqa")
    assert report.skipped == {
        "broken-1": [
            "FinQA's evaluator finds the gold program invalid: step 0: frobnicate(1, 2) is not "
            "op(a, b)"
        ]
    }
    golds = {t["id"]: t["private"]["gold"] for t in tasks_of(out)}
    assert (
        golds["ACME-2019-page_42.pdf-1"]["program"]
        == "add(412, 388), add(#0, 365), divide(#1, const_3)"
    )
    assert golds["ACME-2019-page_42.pdf-1"]["value"] == 388.33333
    assert golds["ACME-2019-page_42.pdf-2"]["value"] == 1.0  # yes
    assert golds["ACME-2019-page_41.pdf-2"]["value"] == 1367.5  # table_average
    checked = asyncio.run(check_pack(out))
    assert checked.ok, [(p.where, p.check, p.message) for p in checked.problems]


def test_one_bad_question_loses_nothing_else(tmp_path: Path) -> None:
    entries = json.loads(TATQA.read_text())
    first = entries[0]["questions"]
    first[0].update(derivation="max(1, 2)", answer_type="arithmetic", answer=5)
    first[1]["answer_type"] = "guess"
    first.append("not a question")
    arithmetic = next(q for q in entries[1]["questions"] if q["answer_type"] == "arithmetic")
    figure = re.findall(r"[\d,.]+", arithmetic["derivation"])[0]
    arithmetic.update(derivation=f"{figure} - {figure}", answer=0)  # 0 whatever the numbers
    entries.append({"questions": 3, "table": {"uid": "t-bad"}})
    entries.append(["not", "an", "entry"])
    source = tmp_path / "bad.json"
    source.write_text(json.dumps(entries))
    report = import_file(source, tmp_path / "pack", "acme/bad")
    assert len(report.imported) == 36 - 3
    skipped = {k: v[0] for k, v in report.skipped.items()}
    assert "cannot read" in skipped[first[0]["uid"]]
    assert "unknown answer_type 'guess'" in skipped[first[1]["uid"]]
    assert "does not depend on the document's numbers" in skipped[arithmetic["uid"]]
    assert "not an object" in skipped[f"question-{len(first) - 1}"]
    assert "questions is not a list" in skipped["t-bad"]
    assert "is a list, not an object" in skipped[f"entry-{len(entries) - 1}"]
    saved = json.loads((tmp_path / "pack" / "import-report.json").read_text())
    assert {s["id"] for s in saved["skipped"]} == set(skipped)


def test_an_output_folder_is_never_silently_overwritten(tmp_path: Path) -> None:
    out = tmp_path / "pack"
    import_file(FINQA, out, "acme/finqa")
    (out / "mine.txt").write_text("keep")
    with pytest.raises(ImportProblem, match="not empty"):
        import_file(TATQA, out, "acme/tatqa")
    assert (out / "mine.txt").exists() and len(tasks_of(out)) == 5
    broken = tmp_path / "broken.json"
    broken.write_text("[{")
    with pytest.raises(ImportProblem, match=r"broken.json: not JSON .* line 1"):
        import_file(broken, out, "acme/x", force=True)
    assert (out / "mine.txt").exists()  # a failed forced import leaves OUT as it was
    import_file(TATQA, out, "acme/tatqa", force=True)
    assert not (out / "mine.txt").exists() and len(tasks_of(out)) == 36
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left


@pytest.mark.parametrize(
    ("text", "cause"),
    [('{"a": 1}', "expected a JSON list"), ("[]", "no importable question"), (b"\xff", "UTF-8")],
)
def test_malformed_files_are_named_with_the_cause(
    tmp_path: Path, text: str | bytes, cause: str
) -> None:
    source = tmp_path / "in.json"
    source.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ImportProblem, match=cause) as raised:
        import_file(source, tmp_path / "pack", "acme/x")
    assert str(source) in str(raised.value)
    with pytest.raises(ImportProblem, match="cannot read"):
        import_file(tmp_path / "missing.json", tmp_path / "pack", "acme/x")


# -- cheats ----------------------------------------------------------------------------------------
def test_tolerance_scale_and_yes_no_games_do_not_pass(tmp_path: Path) -> None:
    import_file(TATQA, tmp_path / "t", "acme/t")
    import_file(FINQA, tmp_path / "f", "acme/f")
    tasks = {**load_pack(tmp_path / "t").tasks, **load_pack(tmp_path / "f").tasks}
    family = FinanceFamily()
    percent = next(t for t in tasks.values() if t.private["gold"]["kind"] == "percent")
    gold = vf.Gold.from_json(percent.private["gold"])
    numbers = imported_numbers(*family.public_fields.of(percent).imported())
    fraction = vf.Answer(value=gold.value, unit="percent", program=gold.program)  # 0.5 for 50 %
    assert vf.grade(fraction, gold, numbers).reward == 0
    right = vf.Answer(value=gold.value, unit="fraction", program=gold.program)  # declared
    assert vf.grade(right, gold, numbers).passed
    text = next(t for t in tasks.values() if t.private["gold"]["kind"] == "text")
    many = ft.TextAnswer(answers=[f"{v:g}" for v in list(numbers.figures.values())[:50]])
    assert ft.grade(many, text.private["gold"]).reward == 0
    yes_no = next(t for k, t in tasks.items() if k.endswith("page_42.pdf-2"))
    cheats = dict(family.cheats(yes_no))
    guess = vf.Answer(**cheats["yes-no-guess"][0].arguments)
    yes_gold = vf.Gold.from_json(yes_no.private["gold"])
    doc = imported_numbers(*family.public_fields.of(yes_no).imported())
    graded = vf.grade(guess, yes_gold, doc)
    assert graded.components["value"] == 1.0 and not graded.passed  # right guess, no comparison
    swapped = vf.Answer(value=0, unit="ratio", program="greater(47.35, 52.10)")
    assert vf.grade(swapped, yes_gold, doc).reward == 0


def test_cli_import(tmp_path: Path) -> None:
    out = tmp_path / "cli-pack"
    runner = CliRunner()
    run = runner.invoke(app, ["pack", "import", "finqa", str(FINQA), str(out), "--verbose"])
    assert run.exit_code == 0, run.output
    assert "5 imported, 1 skipped" in run.output and "frobnicate" in run.output
    again = runner.invoke(app, ["pack", "import", "finqa", str(FINQA), str(out)])
    assert again.exit_code == 2 and "--force" in again.output
    forced = runner.invoke(
        app, ["pack", "import", "finqa", str(FINQA), str(out), "--force", "--strict"]
    )
    assert forced.exit_code == 1  # --strict: a question was skipped
    bad = runner.invoke(
        app, ["pack", "import", "finqa", str(tmp_path / "missing.json"), str(tmp_path / "x")]
    )
    assert bad.exit_code == 2 and "missing.json" in bad.output
