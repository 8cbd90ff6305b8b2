"""Split an arithmetic expression into tokens.

Tokens: numbers (digits with an optional fractional part, like 12 or 3.25, turned into
float), the operators + - * / and the parentheses ( ). Spaces are skipped; any other
character raises ValueError.
"""


def tokenize(text: str) -> list:
    tokens = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch.isspace():
            i += 1
        elif ch.isdigit():
            j = i
            while j < len(text) and text[j].isdigit():
                j += 1
            tokens.append(float(text[i:j]))
            i = j
        elif ch in "+-*/()":
            tokens.append(ch)
            i += 1
        else:
            raise ValueError(f"unexpected character {ch!r} at {i}")
    return tokens
