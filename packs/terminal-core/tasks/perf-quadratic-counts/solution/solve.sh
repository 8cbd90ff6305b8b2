#!/bin/bash
set -euo pipefail
cd /work
python3 - <<'PY'
p = "user_counts.py"
s = open(p).read()
start = s.index("def count_users(lines):")
end = s.index("def main():")
s = s[:start] + '''def count_users(lines):
    counts = {}
    for line in lines:
        user = line.strip()
        if user:
            counts[user] = counts.get(user, 0) + 1
    return list(counts.items())


''' + s[end:]
open(p, "w").write(s)
PY
