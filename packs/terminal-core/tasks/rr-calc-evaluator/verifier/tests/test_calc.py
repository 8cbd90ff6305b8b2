import pytest

from calc import evaluate


def test_simple():
    assert evaluate("1 + 2") == 3
    assert evaluate("6 * 7") == 42


def test_precedence():
    assert evaluate("2 + 3 * 4") == 14


def test_parentheses():
    assert evaluate("2 * (3 + 4)") == 14
    assert evaluate("((5))") == 5


def test_errors():
    for bad in ("", "1 +", "(1", "1 2", "2 $ 3", ")"):
        with pytest.raises(ValueError):
            evaluate(bad)
    with pytest.raises(ZeroDivisionError):
        evaluate("1 / 0")


def test_subtraction_is_left_associative():
    assert evaluate("8 - 3 - 2") == 3
    assert evaluate("10 - 2 + 3") == 11


def test_division_is_left_associative():
    assert evaluate("64 / 4 / 2") == 8
    assert evaluate("8 / 2 * 4") == 16


def test_unary_minus():
    assert evaluate("-3 + 5") == 2
    assert evaluate("2 * -(1 + 1)") == -4
    assert evaluate("--4") == 4


def test_decimals():
    assert evaluate("1.5 * 4") == 6
    assert evaluate("0.25 + 0.5") == 0.75
