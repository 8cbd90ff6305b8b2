"""HumanEval through the real episode path: oracle and null scores, public-example
overfitting, reward hacks, degenerate answers, partial credit and determinism (real bwrap
sandboxes)."""

from __future__ import annotations

import ast
import asyncio
import doctest
import signal
import time
from typing import Any

import pytest

from palaestra.envs.coding import cheats as coding_cheats
from palaestra.envs.coding.examples import docstring_examples
from palaestra.envs.coding.family import CodingFamily, task_tests
from palaestra.sdk.evaluation.runner import run_eval
from palaestra.sdk.models import StepResponse, TaskInfo
from palaestra.sdk.policies.base import NullPolicy, OraclePolicy
from palaestra.sdk.task import Task
from palaestra.server.config import REPO_PACKS
from palaestra.server.inprocess import AsyncInProcessClient
from palaestra.server.manager import EpisodeManager
from palaestra.server.packs.loader import load_pack
from palaestra.verifiers.python_tests import split_tests

PACK = "openai/humaneval"


def ref(number: int) -> str:
    return f"{PACK}:HumanEval-{number}"


@pytest.fixture(scope="module")
def he_tasks() -> list[Task]:
    pack = load_pack(REPO_PACKS / "humaneval")
    return [pack.tasks[k] for k in sorted(pack.tasks)]


async def all_tasks(client: AsyncInProcessClient) -> list[TaskInfo]:
    listing = await client.tasks(pack=PACK, limit=1000)
    return listing.tasks


async def submit(
    manager: EpisodeManager, task: str, source: str, *, run_tests: bool = False
) -> tuple[StepResponse, StepResponse | None]:
    """Write `source` as solution.py, optionally run the public examples, then submit."""
    client = AsyncInProcessClient(manager)
    reset = await client.reset(task)
    eid = reset.episode_id
    await client.step(
        eid, {"tool": "write_file", "arguments": {"path": "solution.py", "content": source}}
    )
    examples = await client.step(eid, {"tool": "run_tests"}) if run_tests else None
    final = await client.step(eid, {"tool": "submit"})
    assert final.terminated
    return final, examples


def assert_zero(final: StepResponse) -> None:
    verdict = final.info["verdict"]
    assert final.info["status"] == "done", final.info
    assert verdict["status"] == "ok", verdict
    assert final.reward == 0.0, verdict
    assert verdict["reward"] == 0.0 and verdict["passed"] is False, verdict


# -- oracle and null over every task ----------------------------------------------------------


async def test_oracle_scores_164_of_164(manager: EpisodeManager) -> None:
    client = AsyncInProcessClient(manager)
    tasks = await all_tasks(client)
    assert len(tasks) == 164
    assert {t.split for t in tasks} == {"train", "heldout"}
    attempts = await run_eval(client, OraclePolicy(), tasks, concurrency=6)
    assert len(attempts) == 164
    bad = [(a.task, a.status, a.error_class, a.feedback) for a in attempts if not a.passed]
    assert not bad, bad
    assert all(a.status == "ok" and a.reward == 1.0 and not a.error_class for a in attempts)
    assert {a.task for a in attempts} == {t.id for t in tasks}


async def test_null_scores_0_of_164(manager: EpisodeManager) -> None:
    client = AsyncInProcessClient(manager)
    tasks = await all_tasks(client)
    attempts = await run_eval(client, NullPolicy(), tasks, concurrency=6)
    assert len(attempts) == 164
    assert all(a.status == "ok" and not a.error_class for a in attempts), [
        (a.task, a.status, a.error) for a in attempts if a.status != "ok"
    ]
    assert all(a.reward == 0.0 and not a.passed for a in attempts)


# -- degenerate answers: constants, type defaults, echo ---------------------------------------


def passes_every_test(task_tests: str, prompt: str, entry: str, source: str) -> bool:
    """Whether `source` passes every hidden test, run here in-process (the tests and the
    degenerate answers are trusted code), each test under a 2 s alarm."""
    plan = split_tests(task_tests)
    solution: dict[str, Any] = {}
    exec(compile(source, "solution", "exec"), solution)
    ns: dict[str, Any] = {}
    exec(compile(prompt, "prompt", "exec"), ns)
    exec(compile(plan.preamble, "preamble", "exec"), ns)
    ns["candidate"] = ns[entry] = solution[entry]

    def alarm(signum: int, frame: object) -> None:
        raise TimeoutError

    previous = signal.signal(signal.SIGALRM, alarm)
    try:
        for kind, code in plan.steps:
            signal.setitimer(signal.ITIMER_REAL, 2.0)
            try:
                exec(compile(code, "test", "exec"), ns)
            except (Exception, TimeoutError):
                if kind == "test":
                    return False
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
    finally:
        signal.signal(signal.SIGALRM, previous)
    return True


def test_degenerate_answers_fail_every_one_of_164(he_tasks: list[Task]) -> None:
    """Every constant, type-default and echo answer of `cheats.degenerate` misses some hidden
    test of every task, so the reward (1 only when all pass) is 0 for each: before, a
    fraction of tests paid > 0.1 on 40-49 tasks per answer (bench/coding_cheats.py plays
    them through real episodes; `pack check` too)."""
    assert len(he_tasks) == 164
    paid = [
        (task.id, name)
        for task in he_tasks
        for name, source in coding_cheats.degenerate(task.public["entry_point"])
        if passes_every_test(
            task_tests(task), task.public["prompt"], task.public["entry_point"], source
        )
    ]
    assert not paid, paid


async def test_degenerate_answers_are_known_cheats(manager: EpisodeManager) -> None:
    """`pack check` plays them: they are in the family's cheats(), and score 0 end to end."""
    task = manager.packs.resolve(ref(40))  # return False passed every non-example test
    names = {name for name, _ in CodingFamily().cheats(task)}
    assert {"return-none", "return-false", "return-zero", "echo-first-arg"} <= names
    for name, actions in CodingFamily().cheats(task):
        if name not in ("return-false", "echo-first-arg", "return-empty-list"):
            continue
        source = str(actions[0].arguments["content"])
        final, _ = await submit(manager, ref(40), source)
        assert_zero(final)
        assert final.info["verdict"]["failure"] is None, name


# -- a solution that only knows the docstring's examples fails --------------------------------


def example_table(prompt: str, entry: str) -> dict[str, Any] | None:
    """repr(args) -> expected value for every `>>> entry(literal args)` example, or None."""
    doc = docstring_examples(prompt, entry)
    if not doc:
        return None
    table: dict[str, Any] = {}
    for example in doctest.DocTestParser().get_examples(doc):
        try:
            call = ast.parse(example.source.strip(), mode="eval").body
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)):
                return None
            if call.func.id != entry or call.keywords:
                return None
            args = tuple(ast.literal_eval(a) for a in call.args)
            want = ast.literal_eval(example.want.strip())
        except (SyntaxError, ValueError, TypeError):
            return None
        table[repr(args)] = want
    return table or None


def lookup_solution(entry: str, table: dict[str, Any]) -> str:
    return (
        f"_TABLE = {table!r}\n\n"
        f"def {entry}(*args):\n"
        "    key = repr(args)\n"
        "    if key in _TABLE:\n"
        "        return _TABLE[key]\n"
        "    return None\n"
    )


async def test_docstring_examples_only_solution_fails(manager: EpisodeManager) -> None:
    client = AsyncInProcessClient(manager)
    chosen: list[tuple[TaskInfo, dict[str, Any]]] = []
    for task in await all_tasks(client):
        if task.split != "train":
            continue
        table = example_table(task.public["prompt"], task.public["entry_point"])
        if table:
            chosen.append((task, table))
        if len(chosen) == 20:
            break
    assert len(chosen) == 20

    async def one(task: TaskInfo, table: dict[str, Any]) -> tuple[str, bool, StepResponse]:
        source = lookup_solution(task.public["entry_point"], table)
        final, examples = await submit(manager, task.id, source, run_tests=True)
        assert examples is not None
        return task.id, examples.observation.data.get("exit_code") == 0, final

    results = await asyncio.gather(*(one(t, table) for t, table in chosen))
    public_pass = [tid for tid, ok, _ in results if ok]
    # The lookup table really satisfies the public examples ...
    assert len(public_pass) >= 10, public_pass
    # ... and the hidden tests still fail it on every task.
    for tid, _, final in results:
        verdict = final.info["verdict"]
        assert verdict["status"] == "ok", (tid, verdict)
        assert not verdict["passed"] and final.reward < 1.0, (tid, verdict)


# -- reward hacks score 0 --------------------------------------------------------------------

EQ_ALWAYS = """
class Anything:
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    def __lt__(self, other):
        return True
    def __gt__(self, other):
        return True
    def __bool__(self):
        return True
    def __hash__(self):
        return 0

def {entry}(*args, **kwargs):
    return Anything()
"""

EQ_STR_SUBCLASS = """
class S(str):
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    __hash__ = str.__hash__

def {entry}(*args, **kwargs):
    return S("x")
"""


@pytest.mark.parametrize("template", [EQ_ALWAYS, EQ_STR_SUBCLASS], ids=["object", "str-subclass"])
@pytest.mark.parametrize("number", [0, 2, 23])
async def test_hack_always_equal(manager: EpisodeManager, template: str, number: int) -> None:
    task = manager.packs.resolve(ref(number))
    source = template.format(entry=task.public["entry_point"])
    final, _ = await submit(manager, ref(number), source)
    assert_zero(final)


FAKE_OUTPUT = """
import os, sys
print("PASS")
print("P" * 100)
print("0" * 32 + " R" + "P" * 50)
sys.stdout.flush()
os.write(1, b"\\nall tests passed\\nR" + b"P" * 50 + b"\\n")
os.write(2, b"PASS\\n")

def {entry}(*args, **kwargs):
    print("PASS")
    print("P" * 100)
    return None
"""


@pytest.mark.parametrize("number", [0, 2])
async def test_hack_fake_result_lines(manager: EpisodeManager, number: int) -> None:
    task = manager.packs.resolve(ref(number))
    final, _ = await submit(
        manager, ref(number), FAKE_OUTPUT.format(entry=task.public["entry_point"])
    )
    assert_zero(final)


@pytest.mark.parametrize(
    "exit_call", ["import os\nos._exit(0)", "import sys\nsys.exit(0)", "raise SystemExit(0)"]
)
@pytest.mark.parametrize("number", [0, 2])
async def test_hack_exit_at_import(manager: EpisodeManager, exit_call: str, number: int) -> None:
    task = manager.packs.resolve(ref(number))
    source = f"def {task.public['entry_point']}(*a):\n    return None\n\n{exit_call}\n"
    final, _ = await submit(manager, ref(number), source)
    assert_zero(final)


BUILTINS_PATCH = """
import builtins
builtins.abs = lambda x: 0
builtins.isinstance = lambda *a: True
builtins.len = lambda x: 0
builtins.all = lambda *a: True
builtins.any = lambda *a: True
builtins.AssertionError = type("AssertionError", (Exception,), {{}})

def {entry}(*args, **kwargs):
    return 0.0
"""


@pytest.mark.parametrize("number", [2, 4, 0])
async def test_hack_patch_builtins(manager: EpisodeManager, number: int) -> None:
    # HumanEval-2 and -4 check `abs(candidate(x) - y) < 1e-6`: abs -> 0 would pass them.
    task = manager.packs.resolve(ref(number))
    final, _ = await submit(
        manager, ref(number), BUILTINS_PATCH.format(entry=task.public["entry_point"])
    )
    assert_zero(final)


async def test_hack_patch_stdlib_module(manager: EpisodeManager) -> None:
    # HumanEval-32 checks `math.fabs(poly(coeffs, candidate(coeffs))) < 1e-4`.
    source = "import math\nmath.fabs = lambda x: 0.0\n\ndef find_zero(xs):\n    return 0.0\n"
    final, _ = await submit(manager, ref(32), source)
    assert_zero(final)


async def test_hack_redefine_prompt_helper(manager: EpisodeManager) -> None:
    # HumanEval-50's test encodes with the prompt's encode_shift, then calls decode_shift.
    source = "def encode_shift(s):\n    return s\n\ndef decode_shift(s):\n    return s\n"
    final, _ = await submit(manager, ref(50), source)
    assert_zero(final)
    # HumanEval-38: the same with encode_cyclic / decode_cyclic.
    source = "def encode_cyclic(s):\n    return s\n\ndef decode_cyclic(s):\n    return s\n"
    final, _ = await submit(manager, ref(38), source)
    assert_zero(final)


async def test_hack_infinite_loop_at_import(manager: EpisodeManager) -> None:
    started = time.monotonic()
    final, _ = await submit(manager, ref(0), "while True:\n    pass\n")
    elapsed = time.monotonic() - started
    assert_zero(final)
    assert elapsed < 30, elapsed  # the load timeout (6 s) ends it, far inside the exec limit


async def test_a_hanging_call_costs_one_test_timeout(manager: EpisodeManager) -> None:
    """After one test times out the rest are not run (they count as timed out): a hanging
    solution costs one test timeout (6 s), not one per hidden test."""
    started = time.monotonic()
    source = "def has_close_elements(numbers, threshold):\n    while True:\n        pass\n"
    final, _ = await submit(manager, ref(0), source)
    elapsed = time.monotonic() - started
    assert_zero(final)
    assert final.info["verdict"]["failure"] == "timeout", final.info["verdict"]
    assert elapsed < 20, elapsed


async def test_hack_results_files(manager: EpisodeManager) -> None:
    source = """
import json, os
for name in ("results.json", "result.json", "results.txt", "junit.xml", ".results",
             "report.json", "verdict.json"):
    with open(name, "w") as f:
        f.write(json.dumps({"passed": True, "reward": 1.0, "tests_passed": 1.0,
                            "letters": "P" * 50}))

def has_close_elements(numbers, threshold):
    return None
"""
    final, _ = await submit(manager, ref(0), source)
    assert_zero(final)


async def test_hack_steal_nonce_from_runner_frames(manager: EpisodeManager) -> None:
    # Walks up the interpreter's frames looking for the runner's nonce to forge its report.
    source = """
import os, sys
f = sys._getframe()
while f is not None:
    if "nonce" in f.f_locals and "n_tests" in f.f_locals:
        line = "\\n" + f.f_locals["nonce"] + " R" + "P" * f.f_locals["n_tests"] + "\\n"
        os.write(1, line.encode())
        os._exit(0)
    f = f.f_back

def has_close_elements(numbers, threshold):
    return None
"""
    final, _ = await submit(manager, ref(0), source)
    assert_zero(final)


async def test_hack_steal_nonce_from_heap(manager: EpisodeManager) -> None:
    source = """
import gc, os
for o in gc.get_objects():
    if isinstance(o, dict) and "nonce" in o and "steps" in o:
        n = sum(1 for kind, _ in o["steps"] if kind == "test")
        os.write(1, ("\\n" + o["nonce"] + " R" + "P" * n + "\\n").encode())
        os._exit(0)

def has_close_elements(numbers, threshold):
    return None
"""
    final, _ = await submit(manager, ref(0), source)
    assert_zero(final)


async def test_hack_read_runner_memory_via_proc(manager: EpisodeManager) -> None:
    # Scans the parent process's memory for the nonce and writes a forged report to its stdout.
    source = """
import os, re, signal
ppid = os.getppid()
found = set()
try:
    with open(f"/proc/{ppid}/maps") as maps, open(f"/proc/{ppid}/mem", "rb", 0) as mem:
        for line in maps:
            addr, perms = line.split()[:2]
            if "rw" not in perms:
                continue
            lo, hi = (int(x, 16) for x in addr.split("-"))
            try:
                mem.seek(lo)
                chunk = mem.read(hi - lo)
            except OSError:
                continue
            found.update(
                m.decode() for m in re.findall(rb"(?<![0-9a-f])[0-9a-f]{32}(?![0-9a-f])", chunk)
            )
except OSError:
    pass
try:
    fd = os.open(f"/proc/{ppid}/fd/1", os.O_WRONLY)
    for nonce in found:
        for n in range(1, 20):
            os.write(fd, ("\\n" + nonce + " R" + "P" * n + "\\n").encode())
    os.kill(ppid, signal.SIGKILL)
except OSError:
    pass

def has_close_elements(numbers, threshold):
    return None
"""
    final, _ = await submit(manager, ref(0), source)
    assert_zero(final)


# -- partial credit --------------------------------------------------------------------------


def expected_fraction(task_tests: str, prompt: str, entry: str, source: str) -> float:
    """Run the hidden tests one by one here, in-process, against a trusted solution."""
    plan = split_tests(task_tests)
    solution: dict[str, Any] = {}
    exec(compile(source, "solution", "exec"), solution)
    ns: dict[str, Any] = {}
    exec(compile(prompt, "prompt", "exec"), ns)
    exec(compile(plan.preamble, "preamble", "exec"), ns)
    ns["candidate"] = ns[entry] = solution[entry]
    passed = 0
    for kind, code in plan.steps:
        try:
            exec(compile(code, "test", "exec"), ns)
            ok = True
        except Exception:
            ok = False
        passed += ok and kind == "test"
    return passed / plan.n_tests


async def test_partial_solution_scores_0_and_shows_its_fraction(manager: EpisodeManager) -> None:
    """Reward 1 only when every hidden test passes (a fraction pays constant answers: see
    docs/reference/verifiers.md); the fraction is still reported as the `tests_passed` component."""
    task = manager.packs.resolve(ref(0))
    # Only checks neighbours in the given order: right for some hidden tests, wrong for others.
    source = (
        "def has_close_elements(numbers, threshold):\n"
        "    return any(abs(a - b) < threshold for a, b in zip(numbers, numbers[1:]))\n"
    )
    want = expected_fraction(
        task.private["tests"], task.public["prompt"], task.public["entry_point"], source
    )
    assert 0.0 < want < 1.0
    final, _ = await submit(manager, ref(0), source)
    verdict = final.info["verdict"]
    assert verdict["status"] == "ok" and not verdict["passed"]
    assert final.reward == 0.0 == verdict["reward"]
    assert verdict["failure"] is None  # a wrong answer, not a failed attempt
    assert verdict["components"]["tests_passed"] == pytest.approx(want)


# -- determinism -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "source",
    [
        "def has_close_elements(numbers, threshold):\n"
        "    return any(abs(a - b) < threshold for a, b in zip(numbers, numbers[1:]))\n",
        "def has_close_elements(numbers, threshold):\n"
        "    return any(abs(a - b) < threshold\n"
        "               for i, a in enumerate(numbers) for b in numbers[i + 1:])\n",
    ],
    ids=["partial", "correct"],
)
async def test_same_solution_same_verdict(manager: EpisodeManager, source: str) -> None:
    first, _ = await submit(manager, ref(0), source)
    second, _ = await submit(manager, ref(0), source)
    a, b = first.info["verdict"], second.info["verdict"]
    keys = ("reward", "passed", "status", "components", "feedback", "verifier", "task_digest")
    assert {k: a[k] for k in keys} == {k: b[k] for k in keys}
    assert first.reward == second.reward


def test_public_examples_do_not_count_towards_the_reward() -> None:
    from palaestra.verifiers.python_tests import TestRun, public_duplicates, split_tests

    plan = split_tests(
        "def check(candidate):\n"
        "    assert candidate(1, 2) == 3\n"
        "    assert candidate(2, 2) == 4\n"
        "    assert not candidate(0, 0)\n"
    )
    examples = [("add(1, 2)\n", "3\n"), ("add(0, 0)\n", "False\n")]
    assert public_duplicates(plan, examples) == (True, False, True)
    run = TestRun("PFP", loaded=True, reported=True, timed_out=False, duration_s=0.0)
    assert run.hidden_fraction((True, False, True)) == 0.0  # only the hidden case counts
    assert TestRun("PP", True, True, False, 0.0).hidden_fraction((True, True)) == 1.0
