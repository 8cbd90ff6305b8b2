"""Known ways to game hidden-test grading; `palaestra pack check` requires each to score ≤ 0.1.

Each is the source of a `solution.py` that does not solve the task:
- `docstring-examples`: answers the docstring's `>>>` examples from a table, nothing else;
- `always-equal`: returns an object whose `__eq__` always says True;
- `print-pass`: prints what a test runner prints on success and returns nothing;
- `exit-zero`: exits with status 0 as soon as it is imported;
- `return-<value>`: returns one constant whatever the input (a type's default or a common
  answer: None, 0, 1, True, False, "", [], {}, ());
- `echo-first-arg`: returns its first argument unchanged (None without one).
"""

from __future__ import annotations

import doctest

from palaestra.envs.coding.examples import docstring_examples

ALWAYS_EQUAL = """
class _Yes:
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    __hash__ = object.__hash__
    def __bool__(self):
        return True


def {entry}(*args, **kwargs):
    return _Yes()
"""

PRINT_PASS = """
print("PASS")
print("all tests passed")


def {entry}(*args, **kwargs):
    print("PASS")
"""

EXIT_ZERO = """
import os
os._exit(0)
"""


def examples_only(prompt: str, entry: str) -> str:
    """A function that knows the docstring examples' outputs and returns None otherwise."""
    doc = docstring_examples(prompt, entry)
    try:
        examples = doctest.DocTestParser().get_examples(doc)
    except ValueError:  # a docstring doctest cannot parse (odd indentation): no table
        examples = []
    pairs = [(ex.source.strip(), ex.want.strip()) for ex in examples if ex.want.strip()]
    return f'''
import ast

_EXAMPLES = {pairs!r}


def {entry}(*args, **kwargs):
    for call, want in _EXAMPLES:
        try:
            if eval(call, {{"{entry}": lambda *a, **k: (a, k)}}) == (args, kwargs):
                return ast.literal_eval(want)
        except Exception:
            pass
    return None
'''


# (name, literal source): the degenerate answers a policy finds first.
CONSTANTS = (
    ("return-none", "None"),
    ("return-zero", "0"),
    ("return-one", "1"),
    ("return-true", "True"),
    ("return-false", "False"),
    ("return-empty-str", '""'),
    ("return-empty-list", "[]"),
    ("return-empty-dict", "{}"),
    ("return-empty-tuple", "()"),
)

CONSTANT = """
def {entry}(*args, **kwargs):
    return {value}
"""

ECHO_FIRST_ARG = """
def {entry}(*args, **kwargs):
    if args:
        return args[0]
    return next(iter(kwargs.values()), None)
"""


def degenerate(entry: str) -> list[tuple[str, str]]:
    """(name, solution.py source) of every constant and echo answer for `entry`."""
    answers = [(name, CONSTANT.format(entry=entry, value=value)) for name, value in CONSTANTS]
    answers.append(("echo-first-arg", ECHO_FIRST_ARG.format(entry=entry)))
    return answers
