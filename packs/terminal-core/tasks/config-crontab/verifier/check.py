"""Parse the crontab, expand each schedule to the times it fires, compare with the goal."""
import re
import sys

NAMES = {
    3: {m: i for i, m in enumerate("jan feb mar apr may jun jul aug sep oct nov dec".split(), 1)},
    4: {d: i for i, d in enumerate("sun mon tue wed thu fri sat".split())},
}
RANGES = [(0, 59), (0, 23), (1, 31), (1, 12), (0, 7)]
ALL = [frozenset(range(lo, hi + 1)) for lo, hi in RANGES]


def fail(msg: str) -> None:
    print("FAIL:", msg)
    sys.exit(1)


def value(text: str, field: int) -> int:
    return NAMES.get(field, {}).get(text.lower(), None) if not text.isdigit() else int(text)


def expand(spec: str, field: int) -> frozenset:
    lo, hi = RANGES[field]
    out: set[int] = set()
    for part in spec.split(","):
        m = re.fullmatch(r"(\*|[A-Za-z0-9]+(?:-[A-Za-z0-9]+)?)(?:/(\d+))?", part)
        if not m:
            raise ValueError(part)
        rng, step = m.group(1), int(m.group(2) or 1)
        if rng == "*":
            a, b = lo, hi
        elif "-" in rng:
            a, b = (value(x, field) for x in rng.split("-"))
        else:
            a = value(rng, field)
            b = a if m.group(2) is None else hi
        if a is None or b is None or not lo <= a <= b <= hi or step < 1:
            raise ValueError(part)
        out.update(range(a, b + 1, step))
    if field == 4 and 7 in out:
        out = (out - {7}) | {0}
    return frozenset(out)


def schedule(*fields: str) -> tuple:
    return tuple(expand(f, i) for i, f in enumerate(fields))


WANT = {
    "/opt/app/reindex.sh": schedule("5", "*", "*", "*", "*"),
    "/opt/app/backup.sh": schedule("30", "2", "*", "*", "*"),
    "/opt/app/report.sh": schedule("0", "8", "*", "*", "1-5"),
    "/opt/app/rotate.sh": schedule("*/15", "*", "*", "*", "*"),
    "/opt/app/cleanup.sh": schedule("0", "0", "1", "*", "*"),
}
try:
    lines = open("/work/crontab", encoding="utf-8").read().splitlines()
except FileNotFoundError:
    fail("/work/crontab is missing")
for keep in ("SHELL=/bin/bash", "MAILTO=ops@example.com"):
    if keep not in (ln.strip() for ln in lines):
        fail(f"the existing line {keep!r} is gone")
got: dict[str, list] = {}
for ln in lines:
    s = ln.strip()
    if not s or s.startswith("#") or re.match(r"^[A-Za-z_][A-Za-z0-9_]*\s*=", s):
        continue
    parts = s.split(None, 5)
    if len(parts) != 6:
        fail(f"not a 5-field cron line: {ln!r}")
    try:
        sched = schedule(*parts[:5])
    except (ValueError, TypeError):
        fail(f"bad schedule in {ln!r}")
    got.setdefault(parts[5], []).append(sched)
if sorted(got) != sorted(WANT):
    fail(f"commands should be {sorted(WANT)}, got {sorted(got)}")
for cmd, sched in WANT.items():
    if got[cmd] != [sched]:
        fail(f"{cmd}: appears {len(got[cmd])} time(s) or runs at the wrong times")
print("PASS")
