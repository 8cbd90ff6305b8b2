#!/bin/bash
set -euo pipefail
cd /work
python3 - <<'PY'
p = "semverlib/version.py"
s = open(p).read()
start = s.index("def compare(a: str, b: str) -> int:")
end = s.index("def latest(versions):")
s = s[:start] + '''def _key(version: str):
    major, minor, patch, pre = _parse(version)
    core = (int(major), int(minor), int(patch))
    if pre is None:
        return core, (1,)
    ids = tuple((0, int(i), "") if i.isdigit() else (1, 0, i) for i in pre.split("."))
    return core, (0, ids)


def compare(a: str, b: str) -> int:
    """-1 if a < b, 0 if they have the same precedence, 1 if a > b."""
    ka, kb = _key(a), _key(b)
    return (ka > kb) - (ka < kb)


''' + s[end:]
open(p, "w").write(s)
PY
