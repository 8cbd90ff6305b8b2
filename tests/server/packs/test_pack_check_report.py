"""`pack check` reports per task: one row each (oracle, rerun, null, the cheats that scored,
the verdict: pass, or the failed checks and each void episode's reason), the summary line
"oracle a/n pass, null b/n zero, cheats c/n ≤ limit, void d", and the same in --json."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from rich.console import Console

from palaestra.cli.pack import render_report
from palaestra.envs import cheatlib
from palaestra.envs.base import (
    Assessment,
    EpisodeContext,
    Family,
    NoArgs,
    StepOutcome,
    Tool,
    ToolArgs,
)
from palaestra.envs.cheatlib import CheatSurface, GenericCheat, Play
from palaestra.envs.echo import EchoFamily, EchoPrivate, EchoPublic
from palaestra.sandbox import SandboxSpec
from palaestra.sdk.models import Action, Observation
from palaestra.sdk.task import Task
from palaestra.server.packcheck import CheckReport, Problem, TaskResult, check_pack


def _report() -> CheckReport:
    report = CheckReport(root=Path("p"), pack="o/p@1", tasks=3, checked=3, cheat_max=0.1)
    report.allow_reasons = {"known": "documented"}
    report.results = {
        "good": TaskResult("good", "train", 1.0, 1.0, 0.0, {"print-pass": 0.0, "known": 0.9}),
        "leaky": TaskResult("leaky", "train", 1.0, 1.0, 0.0, {"print-pass": 0.5}),
        "broken": TaskResult(
            "broken",
            "heldout",
            None,
            None,
            None,
            {"print-pass": None},
            void={"oracle": "sandbox died: OOM"},
            expected=1.0,
        ),
    }
    report.problems = [
        Problem("leaky", "cheat:print-pass", "the known cheat scored 0.500"),
        Problem("broken", "oracle", "the oracle episode was void (sandbox died: OOM)"),
        Problem("broken", "null", "the null episode failed: timeout"),
    ]
    return report


def test_rows_verdicts_and_summary_line() -> None:
    report = _report()
    assert report.summary_line() == "oracle 2/3 pass, null 2/3 zero, cheats 1/3 ≤ 0.1, void 1"
    data = report.to_json()
    assert data["summary"]["line"] == report.summary_line()
    rows = {row["task"]: row for row in data["results"]}
    assert rows["good"]["verdict"] == "pass" and rows["good"]["failed"] == []
    assert rows["leaky"]["verdict"] == "fail" and rows["leaky"]["failed"] == ["cheat:print-pass"]
    assert rows["broken"]["failed"] == ["null", "oracle"]
    assert rows["broken"]["void"] == {"oracle": "sandbox died: OOM"}
    assert rows["leaky"]["cheats"] == {"print-pass": 0.5}

    console = Console(record=True, width=200)
    render_report(report, console)
    text = console.export_text()
    rows_text = text.split("pack check failed")[0]  # the per-task table, not the problems
    lines = {line.split("│")[1].strip(): line for line in rows_text.splitlines() if "│" in line}
    assert "pass" in lines["good"] and "known 0.90" in lines["good"]
    assert "fail cheat:print-pass" in lines["leaky"] and "print-pass 0.50" in lines["leaky"]
    assert "fail null, oracle" in lines["broken"]
    assert "void oracle: sandbox died: OOM" in text
    assert "oracle 2/3 pass, null 2/3 zero, cheats 1/3 ≤ 0.1, void 1" in text


# -- the generic cheat library (envs/cheatlib.py) ---------------------------------------------
class LenientFamily(EchoFamily):
    """A verifier with the answer-form bugs the library looks for: it accepts an answer that
    contains the right label anywhere ("True False"), and compares numbers with `not >`
    (NaN is never greater than the tolerance)."""

    name = "lenient"

    async def verify(self, ctx: EpisodeContext) -> Assessment:
        answer = str(ctx.state.answer or "")
        expected = EchoPrivate.of(ctx.task).answer
        try:
            right = not abs(float(answer) - float(expected)) > 0.01
        except ValueError:
            right = expected.casefold() in answer.casefold().split()
        return Assessment(reward=float(right), passed=right, feedback="lenient")


class BashArgs(ToolArgs):
    command: str
    timeout: float = 30.0


class ShellFamily(Family):
    """A family with a shell whose verifier runs `python3 -c` in the workdir (so the
    workspace is first on its import path) and trusts its exit status."""

    name = "shellcheck"
    description = "write answer.json holding 42"
    tools = (
        Tool("bash", "run a command", BashArgs),
        Tool("submit", "end", NoArgs),
    )
    public_fields = EchoPublic
    private_fields = EchoPrivate

    def sandbox_spec(self, task: Task) -> SandboxSpec:
        return SandboxSpec(memory_mb=512, workspace_mb=64, default_timeout_s=60.0)

    async def reset(self, ctx: EpisodeContext) -> Observation:
        return Observation(text="write 42 into answer.json")

    async def step(self, ctx: EpisodeContext, tool: Tool, args: ToolArgs) -> StepOutcome:
        if isinstance(args, BashArgs):
            sandbox = ctx.sandboxes.episode
            assert sandbox is not None
            run = await sandbox.exec(["bash", "-c", args.command], timeout=args.timeout)
            return StepOutcome(Observation(text=run.stdout[-2000:]))
        return StepOutcome(Observation(text="submitted"), done=True)

    async def verify(self, ctx: EpisodeContext) -> Assessment:
        sandbox = ctx.sandboxes.episode
        assert sandbox is not None
        check = "import json, sys; sys.exit(json.load(open('answer.json')) != 42)"
        run = await sandbox.exec(["python3", "-c", check], timeout=30)
        ok = run.exit_code == 0 and not run.timed_out
        return Assessment(reward=float(ok), passed=ok, failure=None if ok else "wrong_answer")

    def oracle(self, task: Task) -> list[Action]:
        return [
            Action(tool="bash", arguments={"command": "echo 42 > answer.json"}),
            Action(tool="submit", arguments={}),
        ]


def lenient_pack(tmp_path: Path, family: str, answers: dict[str, str]) -> Path:
    root = tmp_path / family
    root.mkdir(parents=True)
    (root / "pack.toml").write_text(
        f'name = "acme/{family}"\nversion = "0.1.0"\nfamilies = ["{family}"]\n[splits.train]\n'
    )
    rows = [
        {
            "id": task_id,
            "family": family,
            "split": "train",
            "public": {"instruction": "Is the sky green? Answer True or False."},
            "private": {"answer": answer},
        }
        for task_id, answer in answers.items()
    ]
    (root / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def test_answer_cheats_over_the_limit_refuse_the_pack(tmp_path: Path) -> None:
    """The family's own cheats all score 0 on this lenient verifier; the library's label
    combination and non-finite number score 1, and the JSON report names each with its task
    and reward."""
    root = lenient_pack(tmp_path, "lenient", {"label": "False", "number": "2.5"})
    report = asyncio.run(check_pack(root, extra_families=[LenientFamily()]))
    assert not report.ok
    data = report.to_json()
    over = {(o["cheat"], o["task"]): o for o in data["over_limit"]}
    assert over[("label-combination/spaced", "label")]["reward"] == 1.0
    assert over[("label-combination/spaced", "label")]["class"] == "label-combination"
    assert over[("non-finite/nan", "number")]["reward"] == 1.0
    assert all(o["limit"] == 0.1 and o["generic"] for o in data["over_limit"])
    assert data["cheat_max_reward"] == 0.1
    # the family's own cheats stay under the limit and are not listed
    assert not {"submit-instruction", "empty-answer"} & {o["cheat"] for o in data["over_limit"]}
    rows = {r["task"]: r for r in data["results"]}
    assert "cheat:label-combination/spaced" in rows["label"]["failed"]
    assert data["generic"]["non-finite/nan"] == "non-finite"


def test_a_strict_answer_verifier_passes_the_library(tmp_path: Path) -> None:
    root = lenient_pack(tmp_path, "echo", {"label": "False", "number": "2.5"})
    report = asyncio.run(check_pack(root))
    assert report.ok, report.problems
    played = set(report.to_json()["generic"])
    assert {"non-finite/nan", "label-combination/commas", "null-information/echo-prompt"} <= played
    assert "reformatted/True-bold" in played and "null-information/constant-True" in played


def test_a_cheat_class_added_to_the_library_is_played(tmp_path: Path) -> None:
    class Guess42(GenericCheat):
        name = "guess-42"
        summary = "answers 42"

        def applies(self, surface: CheatSurface) -> bool:
            return surface.answer is not None

        def plays(self, task: Task, surface: CheatSurface) -> list[Play]:
            assert surface.answer is not None
            return [(self.name, [surface.answer("42")])]

    root = lenient_pack(tmp_path, "echo", {"t": "42"})
    report = asyncio.run(check_pack(root, extra_cheats=[Guess42()]))
    assert [(o.cheat, o.task, o.reward) for o in report.over_limit] == [("guess-42", "t", 1.0)]


def test_every_shape_has_classes() -> None:
    shapes = {row["name"]: row["shapes"] for row in cheatlib.describe()}
    for name in ("module-shadowing", "test-plugin", "early-exit", "always-equal"):
        assert shapes[name] == "shell"
    assert shapes["read-verifier"] == shapes["workspace-exhaustion"] == "shell"
    assert shapes["module-shadowing-files"] == "files"
    for name in ("non-finite", "reformatted", "label-combination", "null-information"):
        assert shapes[name] == "answer"


@pytest.mark.timeout(600)
def test_command_cheats_find_a_verifier_that_imports_from_the_workspace(tmp_path: Path) -> None:
    """On real sandboxes: a verifier that runs `python3 -c` in the workdir imports the
    workspace's json.py (module-shadowing) and the forger's exit 0 passes it; the cheats
    that do not touch its import path score 0."""
    root = lenient_pack(tmp_path, "shellcheck", {"t": "42"})
    report = asyncio.run(check_pack(root, extra_families=[ShellFamily()], concurrency=1))
    rewards = report.results["t"].cheats
    assert report.results["t"].oracle == 1.0 and report.results["t"].null == 0.0
    assert rewards["module-shadowing"] == 1.0
    assert rewards["always-equal"] == 0.0 and rewards["write-results"] == 0.0
    assert ("module-shadowing", "t") in {(o.cheat, o.task) for o in report.over_limit}
    assert "workspace-exhaustion" in rewards  # played to a verdict, never void
    assert "workspace-exhaustion" not in report.results["t"].void


def test_a_constant_label_is_judged_by_its_mean_over_a_domain(tmp_path: Path) -> None:
    """A domain whose answers are all "True" pays the constant "True" on every task: each
    task alone is fine (it is the right answer there), the mean over the domain is not."""
    skewed = {f"t{i}": "True" for i in range(12)}
    report = asyncio.run(check_pack(lenient_pack(tmp_path, "echo", skewed)))
    assert not report.ok
    over = [(o.cheat, o.task, o.reward, o.limit) for o in report.over_limit]
    assert over == [("constant-label/True", "domain:echo/echo", 1.0, 0.55)], over
    assert report.results["t0"].domain_cheats == {
        "constant-label/True": 1.0,
        "constant-label/False": 0.0,
    }
    assert "constant-label/True" not in report.results["t0"].cheats  # not a per-task cheat

    balanced = {f"t{i}": ("True", "False")[i % 2] for i in range(12)}
    assert asyncio.run(check_pack(lenient_pack(tmp_path / "b", "echo", balanced))).ok
