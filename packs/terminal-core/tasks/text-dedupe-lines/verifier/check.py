"""words.clean.txt must equal the cleaned list computed from the untouched input."""
import hashlib
import sys

WORDS_SHA256 = "3b3bef8208ab593193b1ac8fbce0a84f6ee0b62decf3ceddacf910ac240ed07a"


def fail(msg: str) -> None:
    print("FAIL:", msg)
    sys.exit(1)


raw = open("/work/words.txt", "rb").read()
if hashlib.sha256(raw).hexdigest() != WORDS_SHA256:
    fail("/work/words.txt was modified")
want, seen = [], set()
for line in raw.decode().split("\n"):
    line = line.rstrip(" \t")
    if line and line.lower() not in seen:
        seen.add(line.lower())
        want.append(line)
try:
    got = open("/work/words.clean.txt", encoding="utf-8").read()
except FileNotFoundError:
    fail("/work/words.clean.txt is missing")
if got.rstrip("\n").split("\n") != want:
    fail(f"expected {want}\ngot {got.splitlines()}")
print("PASS")
