"""Roman numerals for 1..3999 (standard form: IV, IX, XL, XC, CD, CM)."""

VALUES = [
    (1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),
    (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I"),
]
LETTERS = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}


def to_roman(n: int) -> str:
    if not 1 <= n <= 3999:
        raise ValueError(f"{n} is out of range 1..3999")
    out = []
    for value, letters in VALUES:
        while n >= value:
            out.append(letters)
            n -= value
    return "".join(out)


def from_roman(text: str) -> int:
    """The value of a numeral in standard form (upper case); ValueError otherwise."""
    if not text or any(ch not in LETTERS for ch in text):
        raise ValueError(f"not a roman numeral: {text!r}")
    return sum(LETTERS[ch] for ch in text)
