"""large_files.txt lists exactly the files over 10240 bytes, sorted; the tree is untouched."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sizes import SIZES  # noqa: E402


def fail(msg: str) -> None:
    print("FAIL:", msg)
    sys.exit(1)


want = sorted((p for p, n in SIZES.items() if n > 10240), key=str.encode)
for p, n in SIZES.items():
    if not os.path.isfile(f"/work/data/{p}") or os.path.getsize(f"/work/data/{p}") != n:
        fail(f"data/{p} was changed or removed")
try:
    with open("/work/large_files.txt", encoding="utf-8") as fh:
        got = fh.read().splitlines()
except FileNotFoundError:
    fail("/work/large_files.txt is missing")
if got != want:
    fail(f"expected {want}, got {got}")
print("PASS")
