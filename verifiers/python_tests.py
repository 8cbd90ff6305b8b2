"""Hidden unit tests for function-level Python tasks, run in a fresh sandbox.

The test code (HumanEval's shape: `def check(candidate): assert ...`) is split into
individual test cases, one per top-level statement of `check` that asserts something
about `candidate`, so each is reported apart (the coding family pays only when all pass: a
fraction pays constant and echo answers, docs/reference/verifiers.md). The runner reads its
configuration — including a per-run nonce — from stdin before any untrusted code runs,
and reports one letter per test on a line that starts with the nonce.

The untrusted solution never runs in the runner's process: a worker process (stdout and
stderr to /dev/null, no nonce, no tests) runs the prompt (public: its imports and helpers)
then the solution file, as HumanEval's "prompt plus completion" does, and answers each
`candidate(...)` call over a socket with plain builtin data (tagged JSON; a subclass of a
builtin, such as a Counter or a namedtuple, travels as its base value, read through the base
type's own slots). Workers are forked from a template that the
runner forks before it reads its configuration, so their memory never held the tests or the
nonce, and a worker costs a fork rather than a fresh interpreter. The assertions,
the prompt's helpers and the stdlib modules the tests use all live in the runner, which is
made non-dumpable so the worker cannot read its memory or open its stdout through /proc.
So the solution cannot forge the report (frames, gc, /proc), patch what the tests call
(builtins, `math`), redefine the prompt's helpers, or return an object whose `__eq__`
always says True: it can only choose return values.
"""

from __future__ import annotations

import ast
import functools
import json
import secrets
import time
from dataclasses import dataclass

from palaestra.sandbox import programs
from palaestra.sandbox.forkrun import PythonRun, PythonRunner

VERSION = "1.5.0"  # 1.5: prompt before the solution, BOM, subclass returns
PYTHON = "/usr/bin/python3"

# The runner (programs/python_tests_runner.py) is passed with `python3 -I -S -c` (or run by
# the fork server as such), so nothing the agent wrote is on its path.
RUNNER = programs.text("python_tests_runner.py", package="palaestra.verifiers.programs")


class TestSplitError(ValueError):
    """The test code has no `check(candidate)` function to split."""


@dataclass(frozen=True)
class TestPlan:
    preamble: str
    steps: tuple[tuple[str, str], ...]  # ("setup" | "test", source)

    @property
    def n_tests(self) -> int:
        return sum(1 for kind, _ in self.steps if kind == "test")


@functools.lru_cache(maxsize=4096)
def split_tests(test_code: str, check_name: str = "check") -> TestPlan:
    """Split `def check(candidate): ...` into setup statements and individual tests (cached)."""
    module = ast.parse(test_code)
    check: ast.FunctionDef | None = None
    preamble: list[ast.stmt] = []
    for node in module.body:
        if isinstance(node, ast.FunctionDef) and node.name == check_name:
            check = node
        else:
            preamble.append(node)
    if check is None:
        raise TestSplitError(f"test code defines no {check_name}(candidate) function")
    steps: list[tuple[str, str]] = []
    for stmt in check.body:
        asserts = any(isinstance(n, ast.Assert) for n in ast.walk(stmt))
        uses_candidate = any(
            isinstance(n, ast.Name) and n.id == "candidate" for n in ast.walk(stmt)
        )
        steps.append(("test" if asserts and uses_candidate else "setup", ast.unparse(stmt)))
    if not any(kind == "test" for kind, _ in steps):
        raise TestSplitError("check(candidate) asserts nothing about candidate")
    preamble_source = ast.unparse(ast.Module(body=preamble, type_ignores=[]))
    return TestPlan(preamble=preamble_source, steps=tuple(steps))


def _call_args(node: ast.expr, callee: str | None) -> tuple[object, ...] | None:
    """The literal arguments of `callee(...)` (any name when None), or None."""
    if not isinstance(node, ast.Call) or node.keywords or not isinstance(node.func, ast.Name):
        return None
    if callee is not None and node.func.id != callee:
        return None
    try:
        return tuple(ast.literal_eval(arg) for arg in node.args)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None


def _checked_case(source: str) -> tuple[tuple[object, ...], object] | None:
    """(args, expected) of a test of the form `assert candidate(ARGS) == EXPECTED` (also
    `is True/False`, bare `assert candidate(ARGS)` and `assert not candidate(ARGS)`)."""
    try:
        stmt = ast.parse(source).body[0]
    except (SyntaxError, IndexError):
        return None
    if not isinstance(stmt, ast.Assert):
        return None
    test = stmt.test
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        args = _call_args(test.operand, "candidate")
        return None if args is None else (args, False)
    if isinstance(test, ast.Call):
        args = _call_args(test, "candidate")
        return None if args is None else (args, True)
    if (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.ops[0], ast.Eq | ast.Is)
    ):
        args = _call_args(test.left, "candidate")
        try:
            expected = ast.literal_eval(test.comparators[0])
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return None
        return None if args is None else (args, expected)
    return None


def public_duplicates(plan: TestPlan, examples: list[tuple[str, str]]) -> tuple[bool, ...]:
    """For each test of `plan`, whether it only re-checks a public example.

    `examples` are the task's public (source, want) doctest pairs, like `("f(1, 2)", "3")`.
    Such a test checks nothing the agent was not shown, so it is left out of the reward:
    otherwise hard-coding the docstring's outputs earns partial credit.
    """
    shown: list[tuple[tuple[object, ...], object]] = []
    for source, want in examples:
        try:
            call = ast.parse(source.strip(), mode="eval").body
            expected = ast.literal_eval(want.strip())
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            continue
        args = _call_args(call, None)
        if args is not None:
            shown.append((args, expected))
    flags = []
    for kind, source in plan.steps:
        if kind != "test":
            continue
        case = _checked_case(source)
        flags.append(case is not None and any(_same(case, seen) for seen in shown))
    return tuple(flags)


def _same(a: object, b: object) -> bool:
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:
        return False


@dataclass(frozen=True)
class TestRun:
    """Per-test letters: P passed, F assertion failed, E error, T timed out."""

    letters: str
    loaded: bool
    reported: bool
    timed_out: bool
    duration_s: float
    oom_killed: bool = False

    @property
    def failure(self) -> str | None:
        """The failure class (sdk.models.FAILURE_CLASSES) when the solution failed as a whole
        rather than on some tests; every one of them is the solution's doing."""
        if not self.reported:
            return "timeout" if self.timed_out else "oom" if self.oom_killed else "crash"
        if not self.loaded:
            return "load_error"
        if self.letters and set(self.letters) == {"T"}:
            return "timeout"
        return None

    @property
    def passed(self) -> int:
        return self.letters.count("P")

    @property
    def total(self) -> int:
        return len(self.letters)

    @property
    def all_passed(self) -> bool:
        """The coding family's reward rule: 1 only when every hidden test passed."""
        return self.reported and self.loaded and self.total > 0 and self.passed == self.total

    def hidden_fraction(self, duplicates: tuple[bool, ...]) -> float:
        """The reward: the fraction of tests passed, leaving out re-checked public examples
        (all tests count when every one of them is a public example)."""
        kept = [c for c, dup in zip(self.letters, duplicates, strict=False) if not dup]
        if len(duplicates) != len(self.letters) or not kept:
            kept = list(self.letters)
        return kept.count("P") / len(kept) if kept else 0.0

    def summary(self) -> str:
        if not self.reported:
            why = "it timed out" if self.timed_out else "the solution ended the test process"
            return f"the hidden tests did not report: {why}"
        if not self.loaded:
            return (
                "the solution did not load (missing, syntax error, exception or no such function)"
            )
        counts = {
            name: self.letters.count(c)
            for c, name in (("F", "failed"), ("E", "raised"), ("T", "timed out"))
        }
        rest = ", ".join(f"{n} {name}" for name, n in counts.items() if n)
        return f"{self.passed}/{self.total} hidden tests passed" + (f" ({rest})" if rest else "")


async def run_python_tests(
    run_python: PythonRunner,
    *,
    solution_path: str,
    solution: bytes,
    plan: TestPlan,
    entry_point: str,
    context: str = "",
    test_timeout: float = 6.0,
    load_timeout: float = 6.0,
    total_timeout: float = 60.0,
    memory_mb: int = 1024,
    workspace_mb: int = 64,
) -> TestRun:
    """Run `plan` against `solution` (its bytes) in a one-shot sandbox whose /work holds only
    `solution_path`, through `run_python` (an episode's `Sandboxes.run_python`).

    `context` is trusted public code the tests may call (HumanEval's prompt: helpers such as
    `encode_shift`); it runs in the tests' namespace, so a solution cannot redefine it.
    """
    nonce = secrets.token_hex(16)
    config = {
        "nonce": nonce,
        "solution": solution_path,
        "entry_point": entry_point,
        "context": context,
        "preamble": plan.preamble,
        "steps": plan.steps,
        "test_timeout": test_timeout,
        "load_timeout": load_timeout,
    }
    started = time.perf_counter()
    job = PythonRun(
        RUNNER,
        files={solution_path: solution},
        stdin=json.dumps(config).encode(),
        timeout=total_timeout,
        max_output=1 << 20,
        memory_mb=memory_mb,
        workspace_mb=workspace_mb,
    )
    result = await run_python(job)
    duration = time.perf_counter() - started
    for line in reversed(result.stdout.splitlines()):
        head, _, body = line.partition(" ")
        if head == nonce and body[:1] in ("L", "R"):
            letters = body[1:]
            if len(letters) == plan.n_tests and set(letters) <= set("PFET"):
                return TestRun(
                    letters, body[0] == "R", True, result.timed_out, duration, result.oom_killed
                )
    return TestRun("E" * plan.n_tests, False, False, result.timed_out, duration, result.oom_killed)
