#!/bin/bash
set -euo pipefail
cd /work
python3 - <<'PY'
p = "numerals/roman.py"
s = open(p).read()
s = s.replace("    return sum(LETTERS[ch] for ch in text)\n", '''    total = 0
    for i, ch in enumerate(text):
        value = LETTERS[ch]
        if i + 1 < len(text) and LETTERS[text[i + 1]] > value:
            total -= value
        else:
            total += value
    return total
''')
open(p, "w").write(s)
PY
