"""Hidden unit tests for function-level Python tasks, run in a fresh sandbox.

The test code (HumanEval's shape: `def check(candidate): assert ...`) is split into
individual test cases, one per top-level statement of `check` that asserts something
about `candidate`, so the reward can be the fraction passed. The runner reads its
configuration — including a per-run nonce — from stdin before any untrusted code runs,
and reports one letter per test on a line that starts with the nonce: the solution can
print whatever it likes, it cannot forge that line. Return values must be plain builtin
data, so an object whose `__eq__` always says True passes nothing.
"""

from __future__ import annotations

import ast
import json
import secrets
import time
from dataclasses import dataclass

from palaestra.sandbox import Sandbox

VERSION = "1.0.0"
PYTHON = "/usr/bin/python3"

# The runner is passed with `python3 -I -S -c`, so nothing the agent wrote is on its path.
RUNNER = r"""
import builtins, io, os, signal, sys
def main():
    import json
    cfg = json.loads(sys.stdin.read())
    os.close(0)
    nonce, out = cfg["nonce"], os.write
    clean = dict(builtins.__dict__)
    scalars = (int, float, complex, str, bytes, bool, type(None))
    def plain(v, depth=0):
        t = type(v)
        if depth > 50:
            return False
        if t in (list, tuple, set, frozenset):
            return all(plain(x, depth + 1) for x in v)
        if t is dict:
            return all(plain(k, depth + 1) and plain(x, depth + 1) for k, x in v.items())
        return t in scalars
    class Timeout(BaseException):
        pass
    def on_alarm(signum, frame):
        raise Timeout()
    real_out, real_err = sys.stdout, sys.stderr
    def guarded(seconds, code, ns):
        signal.signal(signal.SIGALRM, on_alarm)
        sys.stdout = sys.stderr = io.StringIO()
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            exec(code, ns)
            return "P"
        except Timeout:
            return "T"
        except AssertionError:
            return "F"
        except BaseException:
            return "E"
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            sys.stdout, sys.stderr = real_out, real_err
    steps = [(kind, compile(code, "<test>", "exec")) for kind, code in cfg["steps"]]
    preamble = compile(cfg["preamble"], "<tests>", "exec")
    n_tests = sum(1 for kind, _ in steps if kind == "test")
    try:
        source = open(cfg["solution"], encoding="utf-8").read()
        solution = compile(source, "solution.py", "exec")
    except BaseException:
        out(1, ("\n" + nonce + " L" + "E" * n_tests + "\n").encode())
        os._exit(0)
    ns = {"__name__": "solution", "__builtins__": dict(clean)}
    loaded = guarded(cfg["load_timeout"], solution, ns)
    fn = ns.get(cfg["entry_point"])
    if loaded != "P" or not callable(fn):
        out(1, ("\n" + nonce + " L" + "E" * n_tests + "\n").encode())
        os._exit(0)
    def candidate(*args, **kwargs):
        value = fn(*args, **kwargs)
        if not plain(value):
            raise TypeError("the solution returned something that is not plain data")
        return value
    tests = {"__name__": "__check__", "__builtins__": dict(clean)}
    exec(compile(cfg["context"], "<prompt>", "exec"), tests)
    exec(preamble, tests)
    tests["candidate"] = tests[cfg["entry_point"]] = candidate
    letters = []
    for kind, code in steps:
        tests["__builtins__"] = dict(clean)
        result = guarded(cfg["test_timeout"], code, tests)
        if kind == "test":
            letters.append(result)
    out(1, ("\n" + nonce + " R" + "".join(letters) + "\n").encode())
    os._exit(0)
main()
"""


class TestSplitError(ValueError):
    """The test code has no `check(candidate)` function to split."""


@dataclass(frozen=True)
class TestPlan:
    preamble: str
    steps: list[tuple[str, str]]  # ("setup" | "test", source)

    @property
    def n_tests(self) -> int:
        return sum(1 for kind, _ in self.steps if kind == "test")


def split_tests(test_code: str, check_name: str = "check") -> TestPlan:
    """Split `def check(candidate): ...` into setup statements and individual tests."""
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
    return TestPlan(preamble=ast.unparse(ast.Module(body=preamble, type_ignores=[])), steps=steps)


@dataclass(frozen=True)
class TestRun:
    """Per-test letters: P passed, F assertion failed, E error, T timed out."""

    letters: str
    loaded: bool
    reported: bool
    timed_out: bool
    duration_s: float

    @property
    def passed(self) -> int:
        return self.letters.count("P")

    @property
    def total(self) -> int:
        return len(self.letters)

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
    sandbox: Sandbox,
    *,
    solution_path: str,
    plan: TestPlan,
    entry_point: str,
    context: str = "",
    test_timeout: float = 6.0,
    load_timeout: float = 6.0,
    total_timeout: float = 60.0,
) -> TestRun:
    """Run `plan` against the solution already written at `solution_path` in `sandbox`.

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
    result = await sandbox.exec(
        [PYTHON, "-I", "-S", "-c", RUNNER],
        stdin=json.dumps(config),
        timeout=total_timeout,
        max_output=1 << 20,
    )
    duration = time.perf_counter() - started
    for line in reversed(result.stdout.splitlines()):
        head, _, body = line.partition(" ")
        if head == nonce and body[:1] in ("L", "R"):
            letters = body[1:]
            if len(letters) == plan.n_tests and set(letters) <= set("PFET"):
                return TestRun(letters, body[0] == "R", True, result.timed_out, duration)
    return TestRun("E" * plan.n_tests, False, False, result.timed_out, duration)
