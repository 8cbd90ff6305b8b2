"""Evaluate tokens by recursive descent.

Grammar (the usual precedence; binary operators are left-associative):
    expr   := term (("+" | "-") term)*
    term   := factor (("*" | "/") factor)*
    factor := "-" factor | "+" factor | NUMBER | "(" expr ")"
Division by zero raises ZeroDivisionError; malformed input raises ValueError.
"""
from calc.tokenizer import tokenize


class _Parser:
    def __init__(self, tokens):
        self.tokens = tokens
        self.pos = 0

    def peek(self):
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self):
        tok = self.peek()
        if tok is None:
            raise ValueError("unexpected end of input")
        self.pos += 1
        return tok

    def expr(self):
        left = self.term()
        if self.peek() in ("+", "-"):
            op = self.take()
            right = self.expr()
            return left + right if op == "+" else left - right
        return left

    def term(self):
        left = self.factor()
        if self.peek() in ("*", "/"):
            op = self.take()
            right = self.term()
            return left * right if op == "*" else left / right
        return left

    def factor(self):
        tok = self.take()
        if isinstance(tok, float):
            return tok
        if tok == "(":
            value = self.expr()
            if self.take() != ")":
                raise ValueError("expected )")
            return value
        raise ValueError(f"unexpected token {tok!r}")


def evaluate(text: str) -> float:
    parser = _Parser(tokenize(text))
    value = parser.expr()
    if parser.peek() is not None:
        raise ValueError(f"unexpected token {parser.peek()!r}")
    return value
