"""first_bad.txt names the regression's commit; main is checked out and unchanged."""
import os
import subprocess
import sys

TIP = "dc803fafe402812972561b6d566754ba778580ea"
FIRST_BAD = "613406756857904ef546a7ddbde3ddb49ad9790b"
ENV = {**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"}


def fail(msg: str) -> None:
    print("FAIL:", msg)
    sys.exit(1)


def git(*args: str) -> tuple[int, str]:
    r = subprocess.run(
        ["git", "-c", "safe.directory=*", "-C", "/work", *args],
        capture_output=True, text=True, env=ENV, timeout=30,
    )
    return r.returncode, r.stdout.strip()


try:
    got = open("/work/first_bad.txt", encoding="utf-8").read().strip()
except FileNotFoundError:
    fail("/work/first_bad.txt is missing")
if got != FIRST_BAD:
    fail(f"first_bad.txt says {got[:50]!r}, which is not the first failing commit")
if git("symbolic-ref", "HEAD") != (0, "refs/heads/main"):
    fail("HEAD is not the branch main (a bisect or detached checkout is left over)")
if git("rev-parse", "main") != (0, TIP):
    fail("main no longer points at its original commit")
if git("ls-files", "first_bad.txt")[1]:
    fail("first_bad.txt must not be committed")
if git("diff", "HEAD", "--name-only")[1]:
    fail("tracked files have uncommitted changes")
print("PASS")
