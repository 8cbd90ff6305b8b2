"""A small arithmetic evaluator: calc.evaluate("2 * (3 + 4)") == 14."""
from calc.parser import evaluate  # noqa: F401
