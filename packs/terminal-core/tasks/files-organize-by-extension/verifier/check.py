"""The files must sit in sorted/<ext>/ with their original contents; inbox holds no file."""
import os
import sys

SOURCES = [
    "Report.TXT", "todo.txt", "photo.JPG", "diagram.png", "data.csv", "Makefile",
    "backup.tar.gz", "deploy.Sh", "LICENSE", "2023/budget.CSV", "2023/summary.md",
    "2023/q4/invoice.PDF", "misc/notes.md", "misc/run.sh", "misc/CHANGELOG",
]


def fail(msg: str) -> None:
    print("FAIL:", msg)
    sys.exit(1)


expected = {}
for src in SOURCES:
    name = os.path.basename(src)
    ext = name.rsplit(".", 1)[1].lower() if "." in name else "other"
    expected[f"sorted/{ext}/{name}"] = f"file {name}\nline two of {src}\n"

os.chdir("/work")
found = set()
for root, _dirs, files in os.walk("sorted"):
    for f in files:
        found.add(os.path.join(root, f))
missing = sorted(set(expected) - found)
extra = sorted(found - set(expected))
if missing:
    fail(f"missing: {missing}")
if extra:
    fail(f"unexpected files in sorted/: {extra}")
for path, text in expected.items():
    with open(path, encoding="utf-8") as fh:
        if fh.read() != text:
            fail(f"{path}: contents changed")
left = [os.path.join(r, f) for r, _d, fs in os.walk("inbox") for f in fs]
if left:
    fail(f"files left in inbox: {sorted(left)}")
print("PASS")
