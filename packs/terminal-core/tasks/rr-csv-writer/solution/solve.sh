#!/bin/bash
set -euo pipefail
cd /work
python3 - <<'PY'
p = "csvlite/writer.py"
s = open(p).read()
s = s.replace('''        return ""
    return str(value)''', '''        return ""
    text = str(value)
    if any(ch in text for ch in ',"\\r\\n'):
        return '"' + text.replace('"', '""') + '"'
    return text''')
open(p, "w").write(s)
PY
