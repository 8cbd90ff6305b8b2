import random

from calc import evaluate


def gen(rng, depth):
    if depth == 0 or rng.random() < 0.3:
        n = rng.randint(1, 9)
        return f"{n}.5" if rng.random() < 0.2 else str(n)
    if rng.random() < 0.15:
        return "-" + gen(rng, depth - 1)
    if rng.random() < 0.2:
        return "(" + gen(rng, depth - 1) + ")"
    op = rng.choice(["+", "-", "*", "/"])
    return gen(rng, depth - 1) + f" {op} " + gen(rng, depth - 1)


def test_against_python():
    rng = random.Random(3)
    checked = 0
    for _ in range(400):
        text = gen(rng, 4)
        try:
            want = eval(text.replace("--", "- -"))  # Python has the same precedence rules
        except ZeroDivisionError:
            continue
        assert abs(evaluate(text) - want) < 1e-9 * max(1.0, abs(want)), text
        checked += 1
    assert checked > 300
