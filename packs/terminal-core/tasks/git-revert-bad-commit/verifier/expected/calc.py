import sys


def parse(expr):
    """Split 'a op b' into (a, op, b); a and b may be negative."""
    left, op, right = expr.split()
    return int(left), op, int(right)


# ---------------------------------------------------------------------------
# operators
# ---------------------------------------------------------------------------


def apply(a, op, b):
    if op == "+":
        return a + b
    if op == "*":
        return a * b
    if op == "-":
        return a - b
    if op == "//":
        return a // b
    raise ValueError(f"unknown operator {op!r}")


if __name__ == "__main__":
    print(apply(*parse(sys.argv[1])))
