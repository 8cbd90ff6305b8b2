"""The adapter to the `reasoning-gym` package: datasets, difficulty levels, entries, scores.

reasoning-gym is imported lazily (it takes over a second), so a server that serves the
reasoning pack from its cache never pays for it until the first verification.

Difficulty (documented in docs and the pack's README): a dataset with a curriculum
(`reasoning_gym.factory.create_curriculum`) has three levels, `easy`, `medium` and `hard`,
its curriculum's global levels 0, 1 and 2 (`set_global_level`, clamped per attribute to the
attribute's own last level) turned into a config by `generate_configuration` with
reasoning-gym's default context (ranges include the easier levels). A dataset without a
curriculum has one level, `default`: its config class's defaults. A task is rebuilt from
(dataset, level, seed, size): the dataset object is `create_dataset(name, **config)` with
that seed and size, and the entry is `dataset[index]`.

Safety: the scorers are library code run in the server process on the agent's answer. A
few of them call Python's `eval` on the answer (to accept a Python list of characters or
rows); for those modules `eval` is replaced by `ast.literal_eval`, which gives the same
value for every literal and refuses code. A few parse the answer with sympy's `parse_expr`,
which evaluates Python: theirs is replaced by `safe_parse_expr`, which first checks on
Python's parse tree that the text is plain arithmetic of bounded size. See EVAL_SCORERS
and SYMPY_SCORERS.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib
import threading
from importlib.metadata import version as _dist_version
from typing import Any

LEVELS: dict[str, int] = {"easy": 0, "medium": 1, "hard": 2}
DEFAULT_LEVEL = "default"

# Scorers that `eval()` the agent's answer: their module's `eval` becomes a literal-only one.
EVAL_SCORERS = {
    "string_insertion": "reasoning_gym.algorithmic.string_insertion",
    "spiral_matrix": "reasoning_gym.algorithmic.spiral_matrix",
    "binary_matrix": "reasoning_gym.algorithmic.binary_matrix",
    "n_queens": "reasoning_gym.games.n_queens",
}
# Scorers that parse the agent's answer with sympy's `parse_expr`, which runs Python `eval`
# (and can be made to compute for ever, e.g. `9**9**9**9`): their `parse_expr` only reads
# arithmetic (see `safe_parse_expr`); anything else raises, and those scorers give 0 then.
SYMPY_SCORERS = {
    "countdown": ("reasoning_gym.games.countdown", "parse_expr"),
    "puzzle24": ("reasoning_gym.games.puzzle24", "parse_expr"),
    "simple_integration": ("reasoning_gym.algebra.simple_integration", "sympy"),
    "intermediate_integration": ("reasoning_gym.algebra.intermediate_integration", "sympy"),
    "polynomial_multiplication": ("reasoning_gym.algebra.polynomial_multiplication", "sp"),
}
SYMPY_MAX_CHARS = 5_000
SYMPY_MAX_DIGITS = 80
SYMPY_MAX_EXPONENT = 100
SYMPY_FUNCTIONS = frozenset(
    [
        "sin",
        "cos",
        "tan",
        "cot",
        "sec",
        "csc",
        "asin",
        "acos",
        "atan",
        "acot",
        "sinh",
        "cosh",
        "tanh",
        "asinh",
        "acosh",
        "atanh",
        "exp",
        "log",
        "ln",
        "sqrt",
        "Abs",
        "abs",
    ]
)
SYMPY_CONSTANTS = frozenset({"pi", "oo"})
_BINOPS = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.Pow, ast.BitXor)


def _check_arithmetic(node: ast.AST, in_power: bool = False) -> None:
    """Allow numbers, one-letter symbols, + - * / ** ^, and calls of a few math functions."""
    if isinstance(node, ast.Expression):
        _check_arithmetic(node.body, in_power)
    elif isinstance(node, ast.BinOp) and isinstance(node.op, _BINOPS):
        if isinstance(node.op, (ast.Pow, ast.BitXor)):
            if in_power:
                raise ValueError("nested powers are not read")
            exponent = node.right
            for sub in ast.walk(exponent):
                value = sub.value if isinstance(sub, ast.Constant) else None
                if isinstance(value, (int, float)) and abs(value) > SYMPY_MAX_EXPONENT:
                    raise ValueError("exponent too large")
            _check_arithmetic(node.left, True)
            _check_arithmetic(node.right, True)
        else:
            _check_arithmetic(node.left, in_power)
            _check_arithmetic(node.right, in_power)
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        _check_arithmetic(node.operand, in_power)
    elif isinstance(node, ast.Constant) and type(node.value) in (int, float):
        if len(str(node.value)) > SYMPY_MAX_DIGITS:
            raise ValueError("number too long")
    elif isinstance(node, ast.Name):
        if not (len(node.id) == 1 or node.id in SYMPY_CONSTANTS):
            raise ValueError(f"name {node.id!r} is not read")
    elif isinstance(node, ast.Call):
        if not (isinstance(node.func, ast.Name) and node.func.id in SYMPY_FUNCTIONS):
            raise ValueError("only a few math functions may be called")
        if node.keywords or not node.args:
            raise ValueError("bad call")
        for arg in node.args:
            _check_arithmetic(arg, in_power)
    else:
        raise ValueError(f"{type(node).__name__} is not read")


def safe_parse_expr(source: Any, *args: Any, **kwargs: Any) -> Any:
    """sympy's `parse_expr`, for arithmetic only: no names but one letter, no attribute, no
    string, no big power (checked on Python's own parse tree before sympy sees the text)."""
    from sympy.parsing.sympy_parser import parse_expr

    if not isinstance(source, str) or len(source) > SYMPY_MAX_CHARS:
        raise ValueError("not an expression")
    _check_arithmetic(ast.parse(source.strip(), mode="eval"))
    return parse_expr(source, *args, **kwargs)


class _SympyWithSafeParse:
    """Stands in for the `sympy` module in a scorer's module: the same but `parse_expr`."""

    def __init__(self, module: Any) -> None:
        self._module = module
        self.parse_expr = safe_parse_expr

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)


_lock = threading.Lock()
_patched = False


def rg_version() -> str:
    """The installed reasoning-gym distribution's version (its `__version__` lags behind)."""
    return _dist_version("reasoning-gym")


def _literal_eval(source: Any, *_: Any) -> Any:
    return ast.literal_eval(source)


def _rg() -> Any:
    """Import reasoning_gym once and make the eval-ing scorers literal-only."""
    global _patched
    with _lock:
        factory = importlib.import_module("reasoning_gym.factory")
        if not _patched:
            for module_name in EVAL_SCORERS.values():
                module = importlib.import_module(module_name)
                module.eval = _literal_eval  # type: ignore[attr-defined]
            for module_name, attr in SYMPY_SCORERS.values():
                module = importlib.import_module(module_name)
                if attr == "parse_expr":
                    module.parse_expr = safe_parse_expr  # type: ignore[attr-defined]
                else:
                    setattr(module, attr, _SympyWithSafeParse(getattr(module, attr)))
            _patched = True
    return factory


def dataset_names() -> list[str]:
    return sorted(_rg().DATASETS)


def levels_of(name: str) -> list[str]:
    return list(LEVELS) if _rg().has_curriculum(name) else [DEFAULT_LEVEL]


def config_for(name: str, level: str, seed: int, size: int) -> dict[str, Any]:
    """The dataset's config (as keyword arguments) for a level, a seed and a size."""
    factory = _rg()
    if level == DEFAULT_LEVEL:
        _, config_cls = factory.DATASETS[name]
        config = config_cls(seed=seed, size=size)
    else:
        curriculum = factory.create_curriculum(name)
        curriculum.set_global_level(LEVELS[level])
        config = curriculum.generate_configuration({"seed": seed, "size": size})
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}


@functools.lru_cache(maxsize=1024)
def dataset(name: str, level: str, seed: int, size: int) -> Any:
    """The reasoning-gym dataset object for (name, level, seed, size), built once."""
    return _rg().create_dataset(name, **config_for(name, level, seed, size))


@functools.lru_cache(maxsize=8192)
def _entry(name: str, level: str, seed: int, size: int, index: int) -> dict[str, Any]:
    entry: dict[str, Any] = dataset(name, level, seed, size)[index]
    return entry


def entry(name: str, level: str, seed: int, size: int, index: int) -> dict[str, Any]:
    """reasoning-gym's own entry (question, answer, metadata) for one task, regenerated."""
    return _entry(name, level, seed, size, index)


def score(
    name: str,
    level: str,
    seed: int,
    size: int,
    index: int,
    answer: str | None,
    entry: dict[str, Any] | None = None,
) -> float:
    """The dataset's own `score_answer(answer, entry)`, on its own regenerated entry unless
    `entry` is given."""
    ds = dataset(name, level, seed, size)
    if entry is None:
        entry = _entry(name, level, seed, size, index)
    return float(ds.score_answer(answer=answer, entry=entry))
