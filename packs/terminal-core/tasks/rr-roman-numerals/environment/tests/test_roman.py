import pytest

from numerals.roman import from_roman, to_roman


def test_to_roman():
    assert to_roman(1) == "I"
    assert to_roman(4) == "IV"
    assert to_roman(1994) == "MCMXCIV"
    assert to_roman(3999) == "MMMCMXCIX"


def test_from_roman_additive():
    assert from_roman("III") == 3
    assert from_roman("MDCLXVI") == 1666


def test_invalid():
    for bad in ("", "ABC", "iv", "X V"):
        with pytest.raises(ValueError):
            from_roman(bad)


def test_from_roman_subtractive():
    assert from_roman("IV") == 4
    assert from_roman("XC") == 90
    assert from_roman("MCMXCIV") == 1994


def test_roundtrip():
    for n in range(1, 4000):
        assert from_roman(to_roman(n)) == n
