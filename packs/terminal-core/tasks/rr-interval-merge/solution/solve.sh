#!/bin/bash
set -euo pipefail
cd /work
python3 - <<'PY'
p = "intervals/merge.py"
s = open(p).read()
start = s.index("def merge(intervals):")
end = s.index("def total_length(intervals):")
s = s[:start] + '''def merge(intervals):
    out = []
    for start, end in sorted((iv[0], iv[1]) for iv in intervals):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return out


''' + s[end:]
open(p, "w").write(s)
PY
