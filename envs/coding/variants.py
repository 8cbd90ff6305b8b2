"""One solution written every way an answer file may take, and wrong ones beside it.

Correct forms of a task's reference solution (the docs allow each: the family's docstring):
a UTF-8 byte-order mark, CRLF line ends, tab indentation, the entry function alone (relying
on the imports and helpers the prompt defines, as HumanEval's "prompt plus completion" does),
and returns of builtin subclasses (a Counter, an OrderedDict, a namedtuple, an IntEnum, a
subclass of str, list...). Wrong ones: a perturbed answer, a constant, a subclass of the
wrong answer whose `__iter__`/`items`/`__int__`... report another value (comparisons read
its real contents, so HumanEval rejects it too), and the always-equal cheats that
HumanEval's `assert candidate(x) == y` accepts but palaestra must not.

tests/envs/coding/test_coding_variants.py and bench/humaneval_agreement.py grade each variant with
palaestra's verifier beside HumanEval's own `check_correctness`.
"""

from __future__ import annotations

import ast
import io
import tokenize
from dataclasses import dataclass
from typing import Literal

from palaestra.envs.coding.cheats import ALWAYS_EQUAL, CONSTANT

BOM = "\ufeff"
Kind = Literal["correct", "wrong", "cheat"]


@dataclass(frozen=True)
class Variant:
    name: str
    # correct: must pass, as HumanEval's check does; wrong: palaestra must say what
    # HumanEval's check says; cheat: a wrong answer palaestra must fail, whatever HumanEval
    # says (its `==` and `sorted(...)` call methods a subclass can override)
    kind: Kind
    source: str  # solution.py as text; written as UTF-8 (so "\ufeff" is the BOM's bytes)

    @property
    def completion(self) -> str:
        """HumanEval's completion for this file: the text as Python reads the file (a BOM is
        an encoding mark, not code), after a newline so it follows the prompt's stub."""
        return "\n" + self.source.removeprefix(BOM)


def crlf(source: str) -> str:
    return source.replace("\r\n", "\n").replace("\n", "\r\n")


def tabs(source: str) -> str:
    """Each logical line indented with one tab a block level (lines inside brackets and
    strings keep their spaces: they carry no indentation)."""
    depth, levels, line_start = 0, {}, True
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.INDENT:
            depth += 1
        elif tok.type == tokenize.DEDENT:
            depth -= 1
        elif tok.type in (tokenize.NEWLINE, tokenize.NL, tokenize.COMMENT, tokenize.ENDMARKER):
            line_start = line_start or tok.type == tokenize.NEWLINE
        elif line_start:
            levels[tok.start[0]] = depth
            line_start = False
    lines = source.splitlines(keepends=True)
    for number, level in levels.items():
        lines[number - 1] = "\t" * level + lines[number - 1].lstrip(" \t")
    return "".join(lines)


def entry_only(prompt: str, entry: str, body: str) -> str:
    """The prompt from the entry function's `def` on, plus `body`: without the imports
    (`from typing import List`) and helpers (`is_palindrome`) written above it."""
    lines = prompt.splitlines(keepends=True)
    for node in ast.parse(prompt).body:
        if isinstance(node, ast.FunctionDef) and node.name == entry:
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            return "".join(lines[first - 1 :]) + body
    raise ValueError(f"the prompt defines no {entry}")


def relies_on_prompt(prompt: str, entry: str) -> bool:
    """Whether the prompt holds code before its entry function (imports, helpers)."""
    return entry_only(prompt, entry, "").strip() != prompt.strip()


# Appended to a correct solution: the entry's answers come back as builtin subclasses.
SUBCLASSED = """

import collections as _collections
import enum as _enum


class _Int(int):
    pass


class _Float(float):
    pass


class _Str(str):
    pass


class _List(list):
    pass


class _Tuple(tuple):
    pass


class _Set(set):
    pass


def _subclassed(v, depth=0):
    t = type(v)
    if depth > 3:
        return v
    if t is dict:
        items = {{k: _subclassed(x, depth + 1) for k, x in v.items()}}
        return {dict_form}
    if t is list:
        return _List(_subclassed(x, depth + 1) for x in v)
    if t is tuple:
        {tuple_form}
    if t is int:
        return {int_form}
    if t is float:
        return _Float(v)
    if t is str:
        return _Str(v)
    if t is set:
        return _Set(v)
    if t is frozenset:
        return type("_Frozen", (frozenset,), {{}})(v)
    return v


_plain_{entry} = {entry}
_depth = [0]


def {entry}(*args, **kwargs):
    _depth[0] += 1  # only the outermost call converts: recursive ones compute as before
    try:
        value = _plain_{entry}(*args, **kwargs)
    finally:
        _depth[0] -= 1
    return _subclassed(value) if _depth[0] == 0 else value
"""

SUBCLASS_FLAVOURS = {
    "subclass-collections": {
        "dict_form": "_collections.Counter(items)",
        "tuple_form": 'return _collections.namedtuple("T", [f"f{i}" for i in range(len(v))])'
        "(*(_subclassed(x, depth + 1) for x in v))",
        "int_form": '_enum.IntEnum("N", {"V": v}).V',
    },
    "subclass-ordered": {
        "dict_form": "_collections.OrderedDict(items)",
        "tuple_form": "return _Tuple(_subclassed(x, depth + 1) for x in v)",
        "int_form": "_Int(v)",
    },
    "subclass-defaultdict": {
        "dict_form": "_collections.defaultdict(int, items)",
        "tuple_form": "return _Tuple(v)",
        "int_form": "_Int(v)",
    },
}

# A wrong answer: the reference's, changed by one step of its own type.
PERTURB = """

def _perturbed(v):
    t = type(v)
    if t is bool:
        return not v
    if t is int:
        return v + 1
    if t is float:
        return v + 1.0
    if t is str:
        return v + "x"
    if t is list:
        return v + [0]
    if t is tuple:
        return v + (0,)
    if t is dict:
        return {{**v, "_extra": 0}}
    if t in (set, frozenset):
        return t(v) | {{"_extra"}}
    if v is None:
        return 0
    return None


_right_{entry} = {entry}


def {entry}(*args, **kwargs):
    right = _right_{entry}(*args, **kwargs)
    return {wrap}(_perturbed(right), right)
"""

# Subclasses of the wrong answer's type that report the right answer through every method a
# subclass can override: iteration, items, item access, length, conversions, text.
# `lying`: `__eq__` is the base type's, so HumanEval's `==` reads the real (wrong) value, but
# its `sorted(candidate(x))` or `len(...)` reads the lie. `lying_eq`: `__eq__` lies too.
LIARS = """

def _liar(wrong, right, eq):
    base = type(wrong)
    if base in (bool, type(None)) or not isinstance(wrong, (int, float, str, list, tuple,
                                                            dict, set, frozenset)):
        if not eq:
            return wrong
        class _Yes:
            def __eq__(self, other):
                return True
            def __ne__(self, other):
                return False
            __hash__ = object.__hash__
        return _Yes()
    members = {
        "__iter__": lambda self: iter(right),
        "__len__": lambda self: len(right),
        "__getitem__": lambda self, i: right[i],
        "__contains__": lambda self, x: x in right,
        "__str__": lambda self: str(right),
        "__repr__": lambda self: repr(right),
        "__hash__": lambda self: hash(right) if not isinstance(right, (list, dict, set)) else 0,
        "__int__": lambda self: int(right) if isinstance(right, (int, float)) else 0,
        "__index__": lambda self: int(right) if isinstance(right, int) else 0,
        "__float__": lambda self: float(right) if isinstance(right, (int, float)) else 0.0,
        "__bool__": lambda self: bool(right),
        "keys": lambda self: right.keys() if isinstance(right, dict) else [],
        "items": lambda self: right.items() if isinstance(right, dict) else [],
        "values": lambda self: right.values() if isinstance(right, dict) else [],
        "copy": lambda self: right,
    }
    if eq:
        members["__eq__"] = lambda self, other: True
        members["__ne__"] = lambda self, other: False
    return type("_Liar", (base,), members)(wrong)


def _lying(wrong, right):
    return _liar(wrong, right, False)


def _lying_eq(wrong, right):
    return _liar(wrong, right, True)
"""

# A subclass of int whose `__eq__` always says True, whatever the task's return type.
INT_EQ_TRUE = """

class _Always(int):
    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __hash__ = int.__hash__


def {entry}(*args, **kwargs):
    return _Always(-12345)
"""


def variants(prompt: str, entry: str, body: str) -> list[Variant]:
    """Every variant of one task: `body` is the reference completion (prompt + body is the
    reference solution.py)."""
    reference = prompt + body
    out = [
        Variant("canonical", "correct", reference),
        Variant("bom", "correct", BOM + reference),
        Variant("crlf", "correct", crlf(reference)),
        Variant("tabs", "correct", tabs(reference)),
        Variant("entry-only", "correct", entry_only(prompt, entry, body)),
        Variant(
            "bom-crlf-tabs-entry-only", "correct", BOM + crlf(tabs(entry_only(prompt, entry, body)))
        ),
    ]
    for name, forms in SUBCLASS_FLAVOURS.items():
        out.append(Variant(name, "correct", reference + SUBCLASSED.format(entry=entry, **forms)))
    out += [
        Variant(
            "perturbed", "wrong", reference + PERTURB.format(entry=entry, wrap="(lambda w, r: w)")
        ),
        Variant("constant-none", "wrong", CONSTANT.format(entry=entry, value="None")),
        Variant(
            "lying-subclass",
            "cheat",
            reference + LIARS + PERTURB.format(entry=entry, wrap="_lying"),
        ),
        Variant("always-equal", "cheat", ALWAYS_EQUAL.format(entry=entry)),
        Variant("int-eq-true", "cheat", INT_EQ_TRUE.format(entry=entry)),
        Variant(
            "lying-subclass-eq",
            "cheat",
            reference + LIARS + PERTURB.format(entry=entry, wrap="_lying_eq"),
        ),
    ]
    return out
