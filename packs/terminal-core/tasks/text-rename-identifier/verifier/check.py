"""Each file must equal its original with exactly the whole-word renames applied."""
import os
import re
import shutil
import subprocess
import sys

# python3 from PATH: sys.executable can name a wrapper that a noexec /tmp cannot run
PYTHON = shutil.which("python3") or "/usr/bin/python3"

HERE = os.path.dirname(os.path.abspath(__file__))
WORD = re.compile(r"(?<![A-Za-z0-9_])get_usr(?![A-Za-z0-9_])")


def fail(msg: str) -> None:
    print("FAIL:", msg)
    sys.exit(1)


orig_root = os.path.join(HERE, "orig", "src")
for r, _d, fs in os.walk(orig_root):
    for f in fs:
        rel = os.path.relpath(os.path.join(r, f), orig_root)
        with open(os.path.join(r, f), encoding="utf-8") as fh:
            want = WORD.sub("fetch_user", fh.read())
        try:
            with open(os.path.join("/work/src", rel), encoding="utf-8") as fh:
                got = fh.read()
        except FileNotFoundError:
            fail(f"src/{rel} is missing")
        if got != want:
            fail(f"src/{rel} differs from the expected renamed version")
out = subprocess.run(
    [PYTHON, "-B", "main.py"], cwd="/work/src", capture_output=True, text=True, timeout=20
)
if out.returncode != 0:
    fail(f"main.py no longer runs: {out.stderr[-500:]}")
print("PASS")
