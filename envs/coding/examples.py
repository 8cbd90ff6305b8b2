"""Public examples of a function task: the `>>>` lines of its docstring, run with doctest."""

from __future__ import annotations

import ast
import doctest

# Runs inside the sandbox: imports solution.py and checks the examples against it.
DOCTEST_RUNNER = r"""
import doctest, importlib.util, sys
source = sys.stdin.read()
spec = importlib.util.spec_from_file_location("solution", "solution.py")
module = importlib.util.module_from_spec(spec)
try:
    spec.loader.exec_module(module)
except BaseException as exc:
    print(f"solution.py failed to load: {type(exc).__name__}: {exc}")
    sys.exit(2)
test = doctest.DocTestParser().get_doctest(source, vars(module), "examples", "docstring", 0)
runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
runner.run(test, out=sys.stdout.write)
failed, attempted = runner.failures, runner.tries
print(f"{attempted - failed}/{attempted} public examples passed")
sys.exit(1 if failed else 0)
"""


def docstring_examples(prompt: str, entry_point: str) -> str:
    """The doctest text of `entry_point`'s docstring, or "" if it has no `>>>` examples."""
    try:
        module = ast.parse(prompt)
    except SyntaxError:
        return ""
    for node in ast.walk(module):
        if isinstance(node, ast.FunctionDef) and node.name == entry_point:
            doc = ast.get_docstring(node) or ""
            try:
                examples = doctest.DocTestParser().get_examples(doc)
            except ValueError:  # inconsistent indentation: not doctest-shaped
                return ""
            return doc if examples else ""
    return ""


def public_examples(prompt: str, entry_point: str) -> list[tuple[str, str]]:
    """The docstring's examples as (source, want) pairs, like `("f(1, 2)\\n", "3\\n")`."""
    doc = docstring_examples(prompt, entry_point)
    if not doc:
        return []
    return [(e.source, e.want) for e in doctest.DocTestParser().get_examples(doc)]
