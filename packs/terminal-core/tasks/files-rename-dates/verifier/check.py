"""Each dated file carries its new name and its old contents; nothing else changed."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from names import PAIRS  # noqa: E402


def fail(msg: str) -> None:
    print("FAIL:", msg)
    sys.exit(1)


os.chdir("/work/reports")
found = set(os.listdir("."))
want = {new for _, new in PAIRS}
if found != want:
    fail(f"missing {sorted(want - found)}; unexpected {sorted(found - want)}")
for old, new in PAIRS:
    with open(new, encoding="utf-8") as fh:
        if fh.read() != f"original name: {old}\n":
            fail(f"{new}: does not hold the contents of {old}")
print("PASS")
