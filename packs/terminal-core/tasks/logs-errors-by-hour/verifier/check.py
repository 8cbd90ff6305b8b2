"""errors_by_hour.csv must equal the per-hour counts of the untouched log."""
import csv
import hashlib
import re
import sys

LOG_SHA256 = "26b211df9a47a835618efc82a5aaa3d3e65586787b0fb82abaeb2725869772ad"
MONTHS = {m: i for i, m in enumerate(
    "Jan Feb Mar Apr May Jun Jul Aug Sep Oct Nov Dec".split(), 1)}
LINE = re.compile(r'^\S+ \S+ \S+ \[(\d\d)/(\w{3})/(\d{4}):(\d\d):\d\d:\d\d [^\]]*\] "[^"]*" (\d{3}) ')


def fail(msg: str) -> None:
    print("FAIL:", msg)
    sys.exit(1)


raw = open("/work/access.log", "rb").read()
if hashlib.sha256(raw).hexdigest() != LOG_SHA256:
    fail("/work/access.log was modified")
rows: dict[str, list[int]] = {}
for line in raw.decode().splitlines():
    m = LINE.match(line)
    assert m, line
    day, mon, year, hour, status = m.groups()
    key = f"{year}-{MONTHS[mon]:02d}-{day}T{hour}"
    row = rows.setdefault(key, [0, 0])
    row[0] += 1
    row[1] += 500 <= int(status) <= 599
want = [["hour", "requests", "server_errors"]]
want += [[k, str(v[0]), str(v[1])] for k, v in sorted(rows.items())]
try:
    with open("/work/errors_by_hour.csv", newline="") as fh:
        got = [[c.strip() for c in row] for row in csv.reader(fh) if row]
except FileNotFoundError:
    fail("/work/errors_by_hour.csv is missing")
if got != want:
    fail(f"expected {want}\ngot {got}")
print("PASS")
