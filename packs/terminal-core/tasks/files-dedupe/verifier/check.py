"""Exactly the later copies of each duplicate group are gone, and removed.txt lists them."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen import tree  # noqa: E402


def fail(msg: str) -> None:
    print("FAIL:", msg)
    sys.exit(1)


files = tree()
groups: dict[str, list[str]] = {}
for path, body in files.items():
    groups.setdefault(body, []).append(path)
keep, removed = set(), []
for paths in groups.values():
    paths.sort(key=lambda p: p.encode())
    keep.add(paths[0])
    removed.extend(paths[1:])
removed.sort(key=lambda p: p.encode())
if not removed:
    fail("generator produced no duplicates")

os.chdir("/work/photos")
found = {os.path.relpath(os.path.join(r, f)) for r, _d, fs in os.walk(".") for f in fs}
if found != keep:
    fail(f"kept files differ: missing {sorted(keep - found)}, should be gone {sorted(found - keep)}")
for path in keep:
    with open(path, encoding="utf-8") as fh:
        if fh.read() != files[path]:
            fail(f"{path}: contents changed")
try:
    with open("/work/removed.txt", encoding="utf-8") as fh:
        lines = fh.read().splitlines()
except FileNotFoundError:
    fail("/work/removed.txt is missing")
if lines != removed:
    fail(f"removed.txt should list {removed}, got {lines}")
print("PASS")
