#!/bin/bash
set -euo pipefail
cd /work
python3 - <<'PY'
p = "envconf/loader.py"
s = open(p).read()
s = s.replace('''    if isinstance(default, bool):
        return bool(text)''', '''    if isinstance(default, bool):
        word = text.strip().lower()
        if word in ("1", "true", "yes", "on"):
            return True
        if word in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"not a boolean: {text!r}")''')
s = s.replace("        return [text]", "        return [item.strip() for item in text.split(\",\") if item.strip()]")
open(p, "w").write(s)
PY
