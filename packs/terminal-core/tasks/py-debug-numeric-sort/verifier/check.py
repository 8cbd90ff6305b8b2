"""Run largest.py on fresh listings and compare with a reference implementation."""
import os
import shutil
import subprocess
import sys
import tempfile

# python3 from PATH: sys.executable can name a wrapper that a noexec /tmp cannot run
PYTHON = shutil.which("python3") or "/usr/bin/python3"

CASES = [
    ("900\t./a.txt\n12000\t./big/video.mp4\n1500\t./docs/manual.pdf\n95\t./x\n"
     "1500\t./docs/appendix.pdf\n300000\t./db/dump.sql\n", None),
    ("5\tb\n5\ta\n40\tz z\n7\tc\n100000\tmy files/huge one.iso\n9\td\n", "4"),
    ("10\tten\n9\tnine\n100\thundred\n", "10"),
    ("2\tb\n2\ta\n2\tc\n1\td\n", "2"),
]


def fail(msg: str) -> None:
    print("FAIL:", msg)
    sys.exit(1)


def reference(text: str, n: str | None) -> str:
    rows = [ln.split("\t", 1) for ln in text.splitlines() if ln]
    rows.sort(key=lambda r: (-int(r[0]), r[1]))
    return "".join(f"{s} {p}\n" for s, p in rows[: int(n or 3)])


with tempfile.TemporaryDirectory() as tmp:
    for i, (text, n) in enumerate(CASES):
        path = os.path.join(tmp, f"listing{i}.txt")
        with open(path, "w") as fh:
            fh.write(text)
        argv = [PYTHON, "-B", "/work/largest.py", path] + (["-n", n] if n else [])
        r = subprocess.run(argv, capture_output=True, text=True, timeout=20)
        if r.returncode != 0:
            fail(f"case {i}: exit status {r.returncode}: {r.stderr.strip()[-300:]}")
        if r.stdout != reference(text, n):
            fail(f"case {i}: printed {r.stdout!r}, want {reference(text, n)!r}")
print("PASS")
