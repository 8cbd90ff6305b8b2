"""release gained exactly one commit whose tree is the old release plus the fix only."""
import os
import subprocess
import sys

RELEASE_TIP = "8ba31fc3e90dfcc01a3fe0099dd46ffa262399ce"
DEV_TIP = "5ca73cab88c29d5da28fb9da776905112042d440"
# the tree of the old release with the fix applied and nothing else
WANT_TREE = "2ab8c8bdf7b646660263e276ddbddf6e8cbe92e5"
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
    return r.stdout.strip()


if git("symbolic-ref", "HEAD") != "refs/heads/release":
    fail("release is not checked out")
if git("rev-parse", "dev") != DEV_TIP:
    fail("the dev branch was changed")
parents = git("rev-list", "--parents", "-n", "1", "release").split()[1:]
if parents != [RELEASE_TIP]:
    fail(f"release's tip should have the single parent {RELEASE_TIP[:12]}, it has {parents}")
if git("rev-parse", "release^{tree}") != WANT_TREE:
    diff = git("diff", "--stat", RELEASE_TIP, "release")
    fail(f"release's files are not the old release plus the fix only:\n{diff}")
if git("diff", "HEAD", "--name-only"):
    fail("tracked files have uncommitted changes")
print("PASS")
