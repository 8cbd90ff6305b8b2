#!/bin/bash
set -euo pipefail
cd /work
python3 - <<'PY'
p = "report.py"
s = open(p).read()
s = s.replace(
    "    return {s: totals[s] / counts[s] for s in totals}",
    "    return {s: (totals[s] / counts[s] if counts[s] else None) for s in totals}",
)
s = s.replace(
    '        print(f"{subject}: {result[subject]:.1f}")',
    '        value = result[subject]\n'
    '        print(f"{subject}: n/a" if value is None else f"{subject}: {value:.1f}")',
)
open(p, "w").write(s)
PY
