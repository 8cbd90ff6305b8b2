"""Every file has exactly the mode the rules give; contents and the set of paths are unchanged.

Only regular files are judged: directory modes do not survive every sandbox backend's
copy of the workspace (bwrap recreates directories as 0755)."""
import os
import stat
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tree import TREE  # noqa: E402


def fail(msg: str) -> None:
    print("FAIL:", msg)
    sys.exit(1)


root = "/work/site"
for path, _initial, want in TREE:
    if want is None:
        continue
    full = os.path.normpath(os.path.join(root, path))
    try:
        st = os.lstat(full)
    except OSError as e:
        fail(f"{path}: {e}")
    if not stat.S_ISREG(st.st_mode):
        fail(f"{path}: not a regular file any more")
    mode = stat.S_IMODE(st.st_mode)
    if mode != want:
        fail(f"{path}: mode {mode:o}, want {want:o}")
found = set()
for r, ds, fs in os.walk(root):
    for n in ds:
        found.add(os.path.relpath(os.path.join(r, n), root) + "/")
    for n in fs:
        found.add(os.path.relpath(os.path.join(r, n), root))
want_paths = {p for p, _i, _w in TREE}
if found != want_paths:
    fail(f"paths changed: missing {sorted(want_paths - found)}, new {sorted(found - want_paths)}")
for path, _i, _w in TREE:
    if _w is not None and _w != 0o600:
        with open(os.path.join(root, path), encoding="utf-8") as fh:
            if fh.read() != f"contents of {path}\n":
                fail(f"{path}: contents changed")
print("PASS")
