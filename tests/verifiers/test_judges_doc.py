"""docs/judges.md: its rubric loads, its settings file configures a real JudgeEndpoint, and
its example family, built from the page's own code blocks, scores an answer through that
endpoint against FakeJudge (tests/judge_fakes.py, a scripted judge named as a fake), caches
the verdict, and ends void when the judge is down (tests/docblocks.py says how the page's
blocks are marked)."""

from __future__ import annotations

import asyncio
import importlib.util
import types
from pathlib import Path

import pytest
from docblocks import write_files
from judge_fakes import FakeJudge, Status, by_rule

from palaestra.envs.base import Assessment, EpisodeContext, Family, Sandboxes
from palaestra.sdk.models import Action
from palaestra.sdk.task import Task
from palaestra.server.config import load_settings
from palaestra.server.judges import ServerJudges
from palaestra.verifiers.judge import Rubric
from palaestra.verifiers.judge_protocol import JudgeUnavailable

PAGE = "judges.md"


def page_files(root: Path) -> dict[str, Path]:
    written = {p.name: p for p in write_files(PAGE, root)}
    assert sorted(written) == ["palaestra.toml", "rubric.toml", "summary_family.py"]
    return written


def page_family(path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("summary_family", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def _no_sandbox(spec: object) -> object:
    raise AssertionError("the example family runs no sandbox")


def test_the_example_family_is_judged_through_the_configured_endpoint(tmp_path: Path) -> None:
    files = page_files(tmp_path)
    rubric = Rubric.load(files["rubric.toml"])
    assert [c.name for c in rubric.criteria] == ["accuracy", "brevity"]
    family = page_family(files["summary_family.py"]).SummaryFamily(files["rubric.toml"])
    assert isinstance(family, Family) and family.judges() == frozenset({"default"})
    task = Task(
        id="t1",
        family="release-summary",
        pack="doc/example",
        domain="summary",
        split="train",
        version="1.0.0",
        public={"changes": "fix: crash on empty input; feat: --json output"},
        private={"reference": "Fixes a crash on empty input and adds JSON output."},
    )
    fake = FakeJudge()
    with fake.serve() as base:
        toml = files["palaestra.toml"].read_text()
        files["palaestra.toml"].write_text(toml.replace("http://127.0.0.1:8000", base))
        settings = load_settings(config_file=files["palaestra.toml"], environ={})
        assert settings.judges["default"].max_concurrency == 16

        async def episode(answer: str) -> tuple[Assessment, Assessment]:
            judges = ServerJudges(settings.judges)
            try:
                ctx = EpisodeContext("e", task, None, {}, Sandboxes(_no_sandbox), judges=judges)
                await family.reset(ctx)
                tool, args = family.parse_action(
                    Action(tool="submit", arguments={"summary": answer})
                )
                await family.step(ctx, tool, args)
                first = await family.verify(ctx)
                again = await family.verify(ctx)  # the same final state: from the cache
                return first, again
            finally:
                await judges.aclose()

        fake.script(default=by_rule(lambda name, choices, text: len(choices) - 1))
        first, again = asyncio.run(episode("Fixes a crash on empty input; adds --json."))
        assert (
            first.reward == 1.0
            and first.passed
            and first.components
            == {
                "accuracy": 1.0,
                "brevity": 1.0,
            }
        )
        assert again == first and len(fake.requests) == 1  # the second verdict was cached
        assert fake.requests[0]["model"] == "judge-model"

        fake.script(default=by_rule(lambda name, choices, text: 0))
        worst, _ = asyncio.run(episode("Something else entirely."))
        assert worst.reward == 0.0 and not worst.passed

        blank, _ = asyncio.run(episode("   "))
        assert blank.failure == "no_answer" and blank.reward == 0.0

        fake.script(default=Status(500))
        with pytest.raises(JudgeUnavailable):  # the manager makes this a void
            asyncio.run(episode("Fixes a crash."))
