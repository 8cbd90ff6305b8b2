"""The archive holds exactly the kept files, under project/, with their contents."""
import os
import sys
import tarfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tree import FILES  # noqa: E402


def fail(msg: str) -> None:
    print("FAIL:", msg)
    sys.exit(1)


for p in FILES:
    try:
        with open(f"/work/project/{p}", encoding="utf-8") as fh:
            if fh.read() != f"this is {p}\n":
                fail(f"project/{p} was modified")
    except FileNotFoundError:
        fail(f"project/{p} was removed")
try:
    tar = tarfile.open("/work/backup.tar.gz", "r:gz")
except (OSError, tarfile.TarError) as e:
    fail(f"/work/backup.tar.gz is not a gzip tar archive: {e}")
got = {}
with tar:
    for m in tar.getmembers():
        name = m.name[2:] if m.name.startswith("./") else m.name
        if m.isdir():
            if any(part in ("node_modules", "__pycache__") for part in name.split("/")):
                fail(f"excluded folder in the archive: {name}")
            continue
        if not m.isfile():
            fail(f"{name}: not a regular file")
        data = tar.extractfile(m)
        assert data is not None
        got[name] = data.read().decode("utf-8", "replace")
want = {f"project/{p}": f"this is {p}\n" for p, keep in FILES.items() if keep}
if set(got) != set(want):
    fail(f"missing {sorted(set(want) - set(got))}; should not be there {sorted(set(got) - set(want))}")
for name, text in want.items():
    if got[name] != text:
        fail(f"{name}: wrong contents in the archive")
print("PASS")
