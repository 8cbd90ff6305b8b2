#!/bin/bash
set -euo pipefail
cd /work
python3 - <<'PY'
p = "textkit/slug.py"
s = open(p).read()
s = s.replace("import re\n", "import re\nimport unicodedata\n")
s = s.replace('''    text = text.lower()
    text = re.sub(r"[^a-z0-9]", "-", text)''', '''    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = text.lower()
    text = re.sub(r"[^a-z0-9]+", "-", text)''')
open(p, "w").write(s)
PY
