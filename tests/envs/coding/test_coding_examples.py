"""`run_tests` checks the docstring's examples without importing doctest in the sandbox;
its verdicts must be doctest's (NORMALIZE_WHITESPACE), example by example."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from packs.humaneval.source import load_tasks  # type: ignore[import-not-found]
from palaestra.envs.coding.examples import EXAMPLES_RUNNER, docstring_examples, examples_input

# The reference: doctest itself, as the coding family ran it before.
DOCTEST = r"""
import doctest, importlib.util, sys
spec = importlib.util.spec_from_file_location("solution", "solution.py")
module = importlib.util.module_from_spec(spec)
try:
    spec.loader.exec_module(module)
except BaseException as exc:
    sys.exit(2)
test = doctest.DocTestParser().get_doctest(sys.stdin.read(), vars(module), "e", "d", 0)
runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
runner.run(test, out=lambda s: None)
print(f"{runner.tries - runner.failures}/{runner.tries} public examples passed")
sys.exit(1 if runner.failures else 0)
"""


def run(program: str, stdin: str, workdir: Path) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, "-c", program],
        input=stdin,
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=60,
    )
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    return done.returncode, last


def wrong_body(prompt: str) -> str:
    return prompt + "    return None\n"


@pytest.mark.parametrize("kind", ["canonical", "wrong"])
def test_runner_agrees_with_doctest_on_humaneval(kind: str, tmp_path: Path) -> None:
    tasks = [t for t in load_tasks() if int(t["id"].split("-")[1]) % 2 == 0]
    compared = 0
    for task in tasks:
        prompt, entry = task["public"]["prompt"], task["public"]["entry_point"]
        doc = docstring_examples(prompt, entry)
        if not doc:
            continue
        body = task["private"]["solution"]
        source = prompt + body if kind == "canonical" else wrong_body(prompt)
        (tmp_path / "solution.py").write_text(source)
        ours = run(EXAMPLES_RUNNER, examples_input(prompt, entry), tmp_path)
        theirs = run(DOCTEST, doc, tmp_path)
        assert ours == theirs, (task["id"], ours, theirs)
        compared += 1
    assert compared >= 30


CASES = {
    "pass": ("def f(x):\n    return x + 1\n", "    >>> f(1)\n    2\n", 0, "1/1"),
    "whitespace": ("def f():\n    return [1, 2]\n", "    >>> f()\n    [1,2]\n", 1, "0/1"),
    "normalized": ("def f():\n    return [1, 2]\n", "    >>> f()\n    [1,\n    2]\n", 0, "1/1"),
    "expected exception": (
        "def f():\n    raise ValueError('bad x')\n",
        "    >>> f()\n    Traceback (most recent call last):\n      ...\n    ValueError: bad x\n",
        0,
        "1/1",
    ),
    "other exception": (
        "def f():\n    raise KeyError('x')\n",
        "    >>> f()\n    Traceback (most recent call last):\n      ...\n    ValueError: x\n",
        1,
        "0/1",
    ),
    "unexpected exception": ("def f():\n    1 / 0\n", "    >>> f()\n    1\n", 1, "0/1"),
    "prints": (
        "def f():\n    print('a')\n    print('b')\n",
        "    >>> f()\n    a\n    b\n",
        0,
        "1/1",
    ),
    "blankline": (
        "def f():\n    print('a\\n')\n",
        "    >>> f()\n    a\n    <BLANKLINE>\n",
        0,
        "1/1",
    ),
    "statement then expr": (
        "def f(n):\n    return n * 2\n",
        "    >>> y = f(2)\n    >>> y\n    4\n    >>> f(y)\n    9\n",
        1,
        "2/3",
    ),
    "nothing expected": ("def f():\n    return None\n", "    >>> f()\n", 0, "1/1"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_runner_cases_match_doctest(name: str, tmp_path: Path) -> None:
    source, examples, code, summary = CASES[name]
    prompt = f'def f(*a):\n    """Doc.\n\n{examples}    """\n'
    (tmp_path / "solution.py").write_text(source)
    ours = run(EXAMPLES_RUNNER, examples_input(prompt, "f"), tmp_path)
    theirs = run(DOCTEST, docstring_examples(prompt, "f"), tmp_path)
    assert ours == theirs == (code, f"{summary} public examples passed")


def test_runner_reports_a_failure_readably(tmp_path: Path) -> None:
    (tmp_path / "solution.py").write_text("def f(x):\n    return x\n")
    prompt = 'def f(x):\n    """\n    >>> f(1)\n    2\n    """\n'
    done = subprocess.run(
        [sys.executable, "-c", EXAMPLES_RUNNER],
        input=examples_input(prompt, "f"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "Failed example:\n    f(1)\nExpected:\n    2\nGot:\n    1\n" in done.stdout


def test_a_solution_that_fails_to_load_exits_2(tmp_path: Path) -> None:
    (tmp_path / "solution.py").write_text("def f(:\n")
    prompt = 'def f(x):\n    """\n    >>> f(1)\n    2\n    """\n'
    code, last = run(EXAMPLES_RUNNER, examples_input(prompt, "f"), tmp_path)
    assert code == 2 and last.startswith("solution.py failed to load: SyntaxError")
