"""senders.txt must equal the counts computed from the original messages' From headers."""
import os
import re
import sys
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))


def fail(msg: str) -> None:
    print("FAIL:", msg)
    sys.exit(1)


counts: Counter[str] = Counter()
for name in sorted(os.listdir(os.path.join(HERE, "orig", "mail"))):
    text = open(os.path.join(HERE, "orig", "mail", name), encoding="utf-8").read()
    try:
        if open(f"/work/mail/{name}", encoding="utf-8").read() != text:
            fail(f"mail/{name} was modified")
    except FileNotFoundError:
        fail(f"mail/{name} was removed")
    header = text.split("\n\n", 1)[0]
    froms = [ln for ln in header.split("\n") if ln.lower().startswith("from:")]
    assert len(froms) == 1, name
    value = froms[0][5:].strip()
    m = re.search(r"<([^>]+)>", value)
    counts[(m.group(1) if m else value).lower()] += 1
want = [f"{n} {a}" for a, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0].encode()))]
try:
    got = open("/work/senders.txt", encoding="utf-8").read().splitlines()
except FileNotFoundError:
    fail("/work/senders.txt is missing")
got = [" ".join(line.split()) for line in got if line.strip()]
if got != want:
    fail(f"expected {want}\ngot {got}")
print("PASS")
