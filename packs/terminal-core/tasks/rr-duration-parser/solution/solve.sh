#!/bin/bash
set -euo pipefail
cd /work
python3 - <<'PY'
p = "timeparse/duration.py"
s = open(p).read()
s = s.replace('_PART = re.compile(r"(\\d+)([hm])")',
              '_FULL = re.compile(r"(?:(\\d+)d)?\\s*(?:(\\d+)h)?\\s*(?:(\\d+)m)?\\s*(?:(\\d+)s)?")')
start = s.index("    compact = text.replace")
end = s.index("def format_duration")
s = s[:start] + '''    m = _FULL.fullmatch(text)
    if not text or not m or not any(m.groups()):
        raise ValueError(f"not a duration: {text!r}")
    return sum(int(v) * size for v, size in zip(m.groups(), UNITS.values()) if v)


''' + s[end:]
open(p, "w").write(s)
PY
