"""Strict comparisons in a repository task's test modules (stdlib only; repo_runner.py
loads it into each test process).

Why: an object that claims to equal anything (``__eq__`` always True) passes any
``assert got == want``. pytest's assertion rewriting is wrapped: each ``==`` / ``!=``
operand and ``in`` left operand of an assert goes through `operand()`, which turns an
object claiming equality with a fresh sentinel into one that equals nothing
(``unittest.mock.ANY`` excepted); an ``in`` container claiming to hold a sentinel becomes
empty; an object of the code under test (a proxy), also inside a plain list, tuple or
dict, becomes a `CodeValue`. The rewritten code objects are remembered (a test must run
one of them).
`strict_unittest` does the same for unittest.TestCase's comparing methods
(``self.assertEqual(got, want)`` compares in unittest's code, which no rewriting reaches).
"""

from __future__ import annotations

import ast
import sys
import types

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

STRICT = "@palaestra_strict"


class Claimed:
    """What an operand that claims to equal anything becomes: equal to nothing."""

    __hash__ = None  # type: ignore[assignment]

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def __eq__(self, other: object) -> bool:
        return False

    def __ne__(self, other: object) -> bool:
        return True

    def __repr__(self) -> str:
        return f"<a {self.kind} that claims to equal anything>"


class CodeValue:
    """An operand that is an object of the code under test (a proxy of its worker's): it
    equals another such object as the code says, and nothing of the test's. Its worker
    answers `==`, so the code's own `__eq__` would decide an `assert got == want`, and it
    can tell any probe from a real expected value (which it also sees): an object of the
    code's class never equals plain data in a strict assert."""

    __hash__ = None  # type: ignore[assignment]

    def __init__(self, value: object, is_code: Callable[[object], bool]) -> None:
        self.value, self._is_code = value, is_code

    def __eq__(self, other: object) -> bool:
        inner = other.value if isinstance(other, CodeValue) else other
        return self._is_code(inner) and bool(self.value == inner)

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __sub__(self, other: object) -> object:
        """assertAlmostEqual's difference, after its ``==`` shortcut: the code's own."""
        return self.value - (other.value if isinstance(other, CodeValue) else other)  # type: ignore[operator]

    def __rsub__(self, other: object) -> object:
        return other - self.value  # type: ignore[operator]

    def __repr__(self) -> str:
        return repr(self.value)


class CodeContainer:
    """A container of the code under test on the right of `in`: a CodeValue on the left
    is looked up as the object it stands for."""

    def __init__(self, value: object) -> None:
        self.value = value

    def __contains__(self, item: object) -> bool:
        inner = item.value if isinstance(item, CodeValue) else item
        return inner in self.value  # type: ignore[operator]

    def __repr__(self) -> str:
        return repr(self.value)


MAX_DEPTH = 50  # how deep operand() looks into plain containers for the code's objects
HONEST_CONTAINERS = (list, tuple, set, frozenset, dict, str, bytes, bytearray, range)


def strict_module(is_code: Callable[[object], bool] = lambda x: False) -> types.ModuleType:
    """`_palaestra_strict`: what rewritten asserts call on their comparison operands.
    `is_code(x)`: whether x is an object of the code under test (a proxy)."""
    mod = types.ModuleType("_palaestra_strict")
    state = {"claims": 0}

    def operand(x: object) -> object:
        mock = sys.modules.get("unittest.mock")
        if mock is not None and x is mock.ANY:
            return x
        if is_code(x):
            return CodeValue(x, is_code)
        if type(x) in (list, tuple, dict):
            return held(x, 0)
        s = object()
        try:
            claims = bool(x == s) or not bool(x != s)
        except Exception:
            claims = False
        if claims:
            state["claims"] += 1
            return Claimed(type(x).__name__)
        return x

    def held(x: Any, depth: int) -> Any:
        """A plain list, tuple or dict (nested) with the code's objects in it as CodeValues
        (a list of always-equal objects crosses as a list of proxies); itself if none."""
        if is_code(x):
            return CodeValue(x, is_code)
        kind = type(x)
        if kind not in (list, tuple, dict) or depth > MAX_DEPTH:
            return x
        values = list(x.values()) if kind is dict else x
        inner = [held(v, depth + 1) for v in values]
        if all(a is b for a, b in zip(inner, values, strict=True)):
            return x
        return dict(zip(x, inner, strict=True)) if kind is dict else kind(inner)

    def container(x: object) -> object:
        if type(x) in HONEST_CONTAINERS or not hasattr(type(x), "__contains__"):
            return x
        try:
            claims = bool(object() in x)  # type: ignore[operator]
        except Exception:
            claims = False
        if claims:
            state["claims"] += 1
            return ()
        return CodeContainer(x) if is_code(x) else x

    mod.operand = operand  # type: ignore[attr-defined]
    mod.container = container  # type: ignore[attr-defined]
    mod.state = state  # type: ignore[attr-defined]
    return mod


class StrictCompare(ast.NodeTransformer):
    """In every assert: ``a == b`` -> ``operand(a) == operand(b)`` (also ``!=``, ``in``)."""

    def visit_Assert(self, node: ast.Assert) -> ast.Assert:
        node.test = _Operands().visit(node.test)
        return node


class _Operands(ast.NodeTransformer):
    def visit_Compare(self, node: ast.Compare) -> ast.Compare:
        self.generic_visit(node)
        values = [node.left, *node.comparators]
        for i, value in enumerate(values):
            near = [node.ops[j] for j in (i - 1, i) if 0 <= j < len(node.ops)]
            left_of_in = i < len(node.ops) and isinstance(node.ops[i], ast.In | ast.NotIn)
            right_of_in = i > 0 and isinstance(node.ops[i - 1], ast.In | ast.NotIn)
            if right_of_in:
                values[i] = _call("container", value)
            elif left_of_in or any(isinstance(op, ast.Eq | ast.NotEq) for op in near):
                values[i] = _call("operand", value)
        node.left, node.comparators = values[0], values[1:]
        return node


def _call(fn: str, value: ast.expr) -> ast.expr:
    func = ast.Attribute(value=ast.Name(id=STRICT, ctx=ast.Load()), attr=fn, ctx=ast.Load())
    return ast.copy_location(ast.Call(func=func, args=[value], keywords=[]), value)


def strict_tree(tree: ast.Module) -> None:
    """Rewrite `tree`'s asserts and import the strict module under a name no source can
    spell (as pytest's own rewriting does)."""
    StrictCompare().visit(tree)
    pos = 0
    for i, stmt in enumerate(tree.body):
        doc = isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and i == 0
        future = isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__"
        if not (doc or future):
            break
        pos = i + 1
    imp = ast.Import(names=[ast.alias(name="_palaestra_strict", asname=STRICT)])
    tree.body.insert(pos, imp)
    ast.fix_missing_locations(tree)


# unittest.TestCase's methods whose first two arguments are compared with == / != (and
# the deprecated aliases, which call the original function, not the attribute).
UNITTEST_PAIRS = ("assertEqual", "assertNotEqual", "assertAlmostEqual", "assertNotAlmostEqual",
                  "assertSequenceEqual", "assertListEqual", "assertTupleEqual", "assertSetEqual",
                  "assertDictEqual", "assertMultiLineEqual")  # fmt: skip
UNITTEST_ALIASES = {"failUnlessEqual": "assertEqual", "assertEquals": "assertEqual",
                    "failIfEqual": "assertNotEqual", "assertNotEquals": "assertNotEqual",
                    "failUnlessAlmostEqual": "assertAlmostEqual",
                    "assertAlmostEquals": "assertAlmostEqual",
                    "failIfAlmostEqual": "assertNotAlmostEqual",
                    "assertNotAlmostEquals": "assertNotAlmostEqual"}  # fmt: skip


def strict_unittest(mod: types.ModuleType) -> None:
    """unittest.TestCase's comparing methods with `mod`'s strict operands (strict_module):
    ``assertEqual(got, want)`` as ``assert got == want`` compares, ``assertIn(x, c)`` as
    ``assert x in c``. An object of the code under test equals nothing of the test's there
    either; plain values compare as before."""
    import unittest

    case = unittest.TestCase
    space = vars(case)

    def pair(original: Callable[..., Any]) -> Callable[..., Any]:
        def method(self: Any, first: object, second: object, *args: Any, **kwargs: Any) -> Any:
            __tracebackhide__ = True
            return original(self, mod.operand(first), mod.operand(second), *args, **kwargs)

        method.__name__ = method.__qualname__ = original.__name__
        return method

    def member(original: Callable[..., Any]) -> Callable[..., Any]:
        def method(self: Any, item: object, container: object, *args: Any, **kw: Any) -> Any:
            __tracebackhide__ = True
            return original(self, mod.operand(item), mod.container(container), *args, **kw)

        method.__name__ = method.__qualname__ = original.__name__
        return method

    patched = {name: pair(space[name]) for name in UNITTEST_PAIRS if name in space}
    patched |= {name: member(space[name]) for name in ("assertIn", "assertNotIn")}
    patched |= {alias: patched[name] for alias, name in UNITTEST_ALIASES.items() if alias in space}
    for name, method in patched.items():
        setattr(case, name, method)


def install_strict(
    trusted_code: list[types.CodeType], is_code: Callable[[object], bool] = lambda x: False
) -> types.ModuleType:
    """Hook pytest's assertion rewriting: strict operands, no cached bytecode, and every
    code object of a rewritten module remembered (a test must run one of them). `is_code`:
    whether an operand is an object of the code under test (see CodeValue)."""
    from _pytest.assertion import rewrite

    mod = strict_module(is_code)
    sys.modules["_palaestra_strict"] = mod
    original_rewrite, original_test = rewrite.rewrite_asserts, rewrite._rewrite_test

    def rewrite_asserts(tree: ast.Module, *args: Any, **kwargs: Any) -> None:
        strict_tree(tree)
        original_rewrite(tree, *args, **kwargs)

    def rewrite_test(*args: Any, **kwargs: Any) -> Any:
        result = original_test(*args, **kwargs)
        stack = [result[1]]
        while stack:
            co = stack.pop()
            trusted_code.append(co)
            stack.extend(c for c in co.co_consts if isinstance(c, types.CodeType))
        return result

    rewrite.rewrite_asserts = rewrite_asserts  # type: ignore[assignment]
    rewrite._rewrite_test = rewrite_test
    rewrite._read_pyc = lambda *a, **k: None
    return mod
