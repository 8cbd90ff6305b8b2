#!/bin/bash
set -euo pipefail
cd /work
python3 - <<'PY'
p = "calc/tokenizer.py"
s = open(p).read()
s = s.replace('''            while j < len(text) and text[j].isdigit():
                j += 1
''', '''            while j < len(text) and text[j].isdigit():
                j += 1
            if j + 1 < len(text) and text[j] == "." and text[j + 1].isdigit():
                j += 1
                while j < len(text) and text[j].isdigit():
                    j += 1
''')
open(p, "w").write(s)

p = "calc/parser.py"
s = open(p).read()
s = s.replace('''        left = self.term()
        if self.peek() in ("+", "-"):
            op = self.take()
            right = self.expr()
            return left + right if op == "+" else left - right
        return left''', '''        left = self.term()
        while self.peek() in ("+", "-"):
            op = self.take()
            right = self.term()
            left = left + right if op == "+" else left - right
        return left''')
s = s.replace('''        left = self.factor()
        if self.peek() in ("*", "/"):
            op = self.take()
            right = self.term()
            return left * right if op == "*" else left / right
        return left''', '''        left = self.factor()
        while self.peek() in ("*", "/"):
            op = self.take()
            right = self.factor()
            left = left * right if op == "*" else left / right
        return left''')
s = s.replace('''        tok = self.take()
        if isinstance(tok, float):''', '''        tok = self.take()
        if tok == "-":
            return -self.factor()
        if tok == "+":
            return self.factor()
        if isinstance(tok, float):''')
open(p, "w").write(s)
PY
