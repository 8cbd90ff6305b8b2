"""unfinished.txt must list the start-without-end request ids of the untouched logs."""
import gzip
import hashlib
import re
import sys

# sha256 of each file's (decompressed) text, oldest first
LOGS = {
    "app.log.3.gz": "2cf840b8423df4e50678342fb3325db5885ccff21f5942876f881a7e1cd2ef60",
    "app.log.2.gz": "66f4c7fd94a7ddc9bcfc2ca5f403fa9c19c141b2b99e9a564df773b2daca0dbc",
    "app.log.1": "acaedf9d72513596af588d5c447310ad2287252f3b87e685948c1f5ceb2aff93",
    "app.log": "6483874f2ebc1a188f7ec9cdc81bf9fa7e48d1fc6c9d1409283cca69b4584e3b",
}
EVENT = re.compile(r"\breq=(\S+) event=(start|end)\b")


def fail(msg: str) -> None:
    print("FAIL:", msg)
    sys.exit(1)


started, ended = set(), set()
for name, digest in LOGS.items():
    path = f"/work/logs/{name}"
    try:
        raw = gzip.open(path).read() if name.endswith(".gz") else open(path, "rb").read()
    except (OSError, EOFError):
        fail(f"logs/{name} is missing or damaged")
    if hashlib.sha256(raw).hexdigest() != digest:
        fail(f"logs/{name} was modified")
    for m in EVENT.finditer(raw.decode()):
        (started if m.group(2) == "start" else ended).add(m.group(1))
want = sorted(started - ended, key=str.encode)
if len(want) < 10:
    fail("fixture problem: too few unfinished requests")
try:
    got = [ln.strip() for ln in open("/work/unfinished.txt").read().splitlines() if ln.strip()]
except FileNotFoundError:
    fail("/work/unfinished.txt is missing")
if got != want:
    fail(f"expected {len(want)} ids, got {len(got)}; first differences: "
         f"missing {sorted(set(want) - set(got))[:5]}, extra {sorted(set(got) - set(want))[:5]}")
print("PASS")
