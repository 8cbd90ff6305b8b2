"""One new commit on the untouched history whose tree is the tip minus the bad commit."""
import os
import shutil
import subprocess
import sys

# python3 from PATH: sys.executable can name a wrapper that a noexec /tmp cannot run
PYTHON = shutil.which("python3") or "/usr/bin/python3"

HERE = os.path.dirname(os.path.abspath(__file__))
ORIGINAL_TIP = "d4fcb632db8b33bce3aa30a9a27ee5b006f3eaed"
ENV = {**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"}


def fail(msg: str) -> None:
    print("FAIL:", msg)
    sys.exit(1)


def git(*args: str) -> str:
    r = subprocess.run(
        ["git", "-c", "safe.directory=*", "-C", "/work", *args],
        capture_output=True, text=True, env=ENV, timeout=30,
    )
    if r.returncode != 0:
        fail(f"git {' '.join(args)}: {r.stderr.strip()}")
    return r.stdout


if git("rev-parse", "--abbrev-ref", "HEAD").strip() != "main":
    fail("HEAD is not on branch main")
if git("rev-parse", "HEAD~1").strip() != ORIGINAL_TIP:
    fail(f"HEAD~1 is not the original tip {ORIGINAL_TIP[:12]}: add exactly one commit on top")
files = sorted(git("ls-tree", "--name-only", "HEAD").split())
if files != ["LICENSE", "README.md", "calc.py"]:
    fail(f"HEAD should track LICENSE, README.md and calc.py, it tracks {files}")
for name in files:
    with open(os.path.join(HERE, "expected", name), encoding="utf-8") as fh:
        if git("show", f"HEAD:{name}") != fh.read():
            fail(f"{name} at HEAD is not the tip's version without the 'Speed up parser' changes")
if git("diff", "HEAD", "--name-only").strip():
    fail("tracked files have uncommitted changes")
for expr, want in (("-3 * 4", "-12"), ("7 // 2", "3"), ("10 - -5", "15")):
    r = subprocess.run([PYTHON, "-B", "/work/calc.py", expr], capture_output=True,
                       text=True, timeout=20)
    if r.stdout.strip() != want:
        fail(f"calc.py {expr!r} printed {r.stdout.strip()!r}, want {want!r}")
print("PASS")
