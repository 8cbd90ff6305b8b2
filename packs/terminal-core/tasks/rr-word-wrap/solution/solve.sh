#!/bin/bash
set -euo pipefail
cd /work
python3 - <<'PY'
p = "wraptext/wrap.py"
s = open(p).read()
s = s.replace('''        line = ""
        for word in words:''', '''        line = ""
        pieces = [w[i : i + width] for w in words for i in range(0, len(w), width)]
        for word in pieces:''')
s = s.replace("len(line) + 1 + len(word) < width", "len(line) + 1 + len(word) <= width")
open(p, "w").write(s)
PY
