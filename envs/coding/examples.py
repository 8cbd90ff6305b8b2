"""Public examples of a function task: the `>>>` lines of its docstring, run as doctest does."""

from __future__ import annotations

import ast
import doctest
import json

# Runs inside the sandbox: loads solution.py and checks the examples against it, as
# doctest's runner would with NORMALIZE_WHITESPACE. The examples arrive parsed (JSON on
# stdin, see `examples_input`), so the sandbox never imports doctest: that import
# (inspect, pdb, difflib, unittest…) costs ≈ 25 ms of CPU, twice the interpreter's
# start, and `run_tests` is one of a coding episode's hottest steps.
EXAMPLES_RUNNER = r"""
import io, json, sys, types
given = json.loads(sys.stdin.read())
examples = given["examples"]
module = types.ModuleType("solution")
module.__file__ = "solution.py"
sys.modules["solution"] = module
try:  # the prompt first (its imports and helpers), as the hidden tests' worker does
    exec(compile(given["prompt"], "<prompt>", "exec"), module.__dict__)
except BaseException:
    pass
try:
    with open("solution.py", "rb") as f:  # bytes: a BOM or coding cookie, as Python reads it
        exec(compile(f.read(), "solution.py", "exec"), module.__dict__)
except BaseException as exc:
    print(f"solution.py failed to load: {type(exc).__name__}: {exc}")
    sys.exit(2)
globs = dict(module.__dict__)
HEADER = "Traceback (most recent call last):"

def squash(text):
    return " ".join(text.replace("<BLANKLINE>", "").split())

def exception_line(exc):
    kind = type(exc)
    name = kind.__qualname__
    if kind.__module__ not in ("builtins", "__main__"):
        name = f"{kind.__module__}.{name}"
    message = str(exc)
    return f"{name}: {message}" if message else name

def indent(text):
    return "".join("    " + line + "\n" for line in text.rstrip("\n").split("\n"))

failed = 0
for source, want, lineno in examples:
    out, real = io.StringIO(), sys.stdout
    sys.stdout = out
    raised = None
    try:
        exec(compile(source, "<example>", "single"), globs)
    except BaseException as exc:
        raised = exc
    finally:
        sys.stdout = real
    got = out.getvalue()
    if want.startswith(HEADER):
        lines = [l for l in want.split("\n")[1:] if l and not l[0].isspace()]
        ok = raised is not None and squash(exception_line(raised)) == squash("\n".join(lines))
        if raised is not None:
            got += HEADER + "\n    ...\n" + exception_line(raised) + "\n"
    else:
        ok = raised is None and (got == want or squash(got) == squash(want))
        if raised is not None:
            got += HEADER + "\n    ...\n" + exception_line(raised) + "\n"
    if not ok:
        failed += 1
        print("*" * 70)
        print(f"Line {lineno + 1}, in docstring")
        print("Failed example:")
        print(indent(source), end="")
        print("Expected:" if want else "Expected nothing")
        if want:
            print(indent(want), end="")
        print("Got:" if got else "Got nothing")
        if got:
            print(indent(got), end="")
print(f"{len(examples) - failed}/{len(examples)} public examples passed")
sys.exit(1 if failed else 0)
"""


def examples_input(prompt: str, entry_point: str) -> str:
    """`EXAMPLES_RUNNER`'s stdin ("" when the docstring has no examples): JSON holding the
    prompt (run before solution.py, as the hidden tests do) and the examples as
    [source, want, line] triples."""
    doc = docstring_examples(prompt, entry_point)
    if not doc:
        return ""
    examples = doctest.DocTestParser().get_examples(doc)
    triples = [[e.source, e.want, e.lineno] for e in examples]
    return json.dumps({"prompt": prompt, "examples": triples})


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
