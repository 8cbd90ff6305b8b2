"""Imported ``test.sh`` tasks whose script copies the verifier's tests into the agent's
workspace and runs pytest there (Terminal-Bench's aider_polyglot tasks:
``find $TEST_DIR -name "*test*.py" -exec cp {} . \\;`` then ``python3 -m pytest .`` in /app).

The test module pytest collects from the workspace was trusted whatever its bytes, and
``self.assertEqual(got, want)`` compared in unittest's code, where no strict assert
reaches: the `always-equal` cheat (envs/cheat_scripts/always_equal.py) scored 1.0 on
polyglot_python_proverb, and a test file of the agent's own ran in the monitored session
(a wrong solution passed once it patched ``unittest.TestCase.assertEqual``). Now (bwrap):

- the honest solution scores 1, a wrong one 0, always-equal 0;
- a workspace test file whose bytes are none of the verifier's is the agent's code: it runs
  in the worker and its tests are not collected; an edited copy of the verifier's test
  planted under its name is overwritten by the script's own ``cp`` (its semantics hold);
- a solution that rewrites a copied test file while pytest collects (at its import, from
  the worker) gains nothing: the copy is loaded from the bytes read before the session ran
  any of the agent's code.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from palaestra.sandbox import SandboxSpec
from palaestra.sandbox.bwrap import BwrapBackend, bwrap_available
from palaestra.verifiers.terminal import TerminalRun, files_tar, verify_workspace

WHY_NO_BWRAP = "" if bwrap_available()[0] else f"bwrap unavailable: {bwrap_available()[1]}"
pytestmark = pytest.mark.skipif(bool(WHY_NO_BWRAP), reason=WHY_NO_BWRAP)

ALWAYS_EQUAL = (
    Path(__file__).resolve().parents[2] / "envs" / "cheat_scripts" / "always_equal.py"
).read_text()
# the aider_polyglot run-tests.sh, less its installs and other languages
TEST_SH = """#!/bin/bash
cd /work
find $VERIFIER_DIR/tests -name "*test*.py" -exec cp {} . \\;
python3 -m pytest . -v --tb=short
"""
ADD_TEST = """import unittest

from calc import add


class AddTest(unittest.TestCase):
    def test_add(self):
        self.assertEqual(add(2, 3), 5)

    def test_in(self):
        self.assertIn(add(1, 1), [2])
"""
MUL_TEST = """import unittest

from calc import mul


class MulTest(unittest.TestCase):
    def test_mul(self):
        self.assertEqual(mul(2, 3), 6)
"""
VERIFIER = {"test.sh": TEST_SH, "tests/add_test.py": ADD_TEST, "tests/mul_test.py": MUL_TEST}
SOLVED = "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a * b\n"
WRONG_MUL = SOLVED.replace("return a * b", "return 0")
WRONG = WRONG_MUL.replace("return a + b", "return 0")
# an agent's test file: were it run in the session, every assertEqual would pass
PATCHER = """import unittest

unittest.TestCase.assertEqual = lambda *args, **kwargs: None
unittest.TestCase.assertIn = lambda *args, **kwargs: None


def test_mine():
    pass
"""
GUTTED = MUL_TEST.replace("self.assertEqual(mul(2, 3), 6)", "pass")
# the race: when pytest imports add_test.py (calc is then imported in the worker), rewrite
# the copied mul_test.py, not imported yet, so that its test passes
RACER = (
    WRONG_MUL
    + f"""

with open("/work/mul_test.py", "w") as _f:
    _f.write({GUTTED!r})
"""
)


async def _verify(files: dict[str, str], verifier: dict[str, str] = VERIFIER) -> TerminalRun:
    backend = BwrapBackend()
    try:
        async with await backend.create(SandboxSpec(workspace_mb=16)) as box:
            return await verify_workspace(
                box,
                files_tar(files),
                workdir="/work",
                verifier=verifier,
                environment={},
                timeout_s=60.0,
            )
    finally:
        await backend.aclose()


async def test_honest_scores_one_wrong_and_always_equal_zero() -> None:
    solved = await _verify({"calc.py": SOLVED})
    wrong = await _verify({"calc.py": WRONG})
    cheat = await _verify({"calc.py": WRONG + "\n\n" + ALWAYS_EQUAL})
    assert solved.reward == 1.0, solved.feedback()
    assert wrong.reward == 0.0, wrong.feedback()
    assert cheat.reward == 0.0, cheat.feedback()
    assert "AssertionError" in cheat.feedback(), cheat.feedback()


async def test_a_test_file_of_the_agents_runs_as_its_code() -> None:
    """Its unittest patch stays in the worker; a wrong solution still fails. With the
    honest one, its test is not collected: the verifier's tests decide alone."""
    planted = await _verify({"calc.py": WRONG, "aaa_test.py": PATCHER})
    assert planted.reward == 0.0, planted.feedback()
    honest = await _verify({"calc.py": SOLVED, "aaa_test.py": PATCHER})
    assert honest.reward == 1.0, honest.feedback()


async def test_an_edited_copy_is_overwritten_by_the_scripts_own_copy() -> None:
    assert "assert" not in GUTTED and "def test_mul" in GUTTED
    edited = await _verify({"calc.py": WRONG_MUL, "mul_test.py": GUTTED})
    assert edited.reward == 0.0, edited.feedback()
    assert "test_mul" in edited.feedback(), edited.feedback()


async def test_rewriting_a_copied_test_during_collection_gains_nothing() -> None:
    assert "/work/mul_test.py" in RACER
    raced = await _verify({"calc.py": RACER})
    assert raced.reward == 0.0, raced.feedback()
    assert "0 != 6" in raced.feedback(), raced.feedback()


# a list of always-equal objects crosses from the worker as a plain list of proxies: each
# element's own __eq__ answered `got == want` in the worker, in an assert or assertEqual
LINES_TEST = """import unittest

from calc import lines


class LinesTest(unittest.TestCase):
    def test_lines(self):
        self.assertEqual(lines(2), ["a", "b"])


def test_lines_assert():
    assert lines(2) == ["a", "b"]
    assert {"all": (lines(1),)} == {"all": (["a"],)}
"""
YES_LIST = """class _Yes:
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __hash__ = object.__hash__


def lines(n):
    return [_Yes() for _ in range(n)]
"""


async def test_always_equal_objects_inside_a_plain_list_score_zero() -> None:
    verifier = {"test.sh": TEST_SH, "tests/lines_test.py": LINES_TEST}
    honest = 'def lines(n):\n    return ["a", "b"][:n]\n'
    solved = await _verify({"calc.py": honest}, verifier)
    cheat = await _verify({"calc.py": YES_LIST}, verifier)
    assert solved.reward == 1.0, solved.feedback()
    assert cheat.reward == 0.0, cheat.feedback()
    assert "2 failed" in cheat.feedback(), cheat.feedback()
