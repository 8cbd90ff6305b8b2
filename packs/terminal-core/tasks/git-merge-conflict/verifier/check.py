"""A two-parent merge commit on main with the given resolution and both sides' other changes."""
import os
import subprocess
import sys

MAIN_TIP = "3e1178ac2795b14e0fbfaf11e85a6a6e23cfd9d5"
FEATURE_TIP = "a59b8d648245c3785b40e1a42705886f5b4ef474"
WANT = {
    "settings.conf": "# service settings\nname = ingest\ntimeout = 30\nretries = 5\n"
    "log_level = info\nworkers = 4\n",
    "README.md": "ingest service\n\nSee settings.conf.\n",
    "retry.py": "def backoff(n):\n    return min(2 ** n, 60)\n",
}
ENV = {**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"}


def fail(msg: str) -> None:
    print("FAIL:", msg)
    sys.exit(1)


def git(*args: str, check: bool = True) -> str:
    r = subprocess.run(
        ["git", "-c", "safe.directory=*", "-C", "/work", *args],
        capture_output=True, text=True, env=ENV, timeout=30,
    )
    if check and r.returncode != 0:
        fail(f"git {' '.join(args)}: {r.stderr.strip()}")
    return r.stdout


if git("rev-parse", "--abbrev-ref", "HEAD").strip() != "main":
    fail("HEAD is not on branch main")
if git("rev-parse", "feature").strip() != FEATURE_TIP:
    fail("the feature branch was changed")
parents = git("rev-list", "--parents", "-n", "1", "HEAD").split()[1:]
if parents != [MAIN_TIP, FEATURE_TIP]:
    fail(f"HEAD's parents are {parents}, want [old main {MAIN_TIP[:12]}, feature {FEATURE_TIP[:12]}]")
files = sorted(git("ls-tree", "--name-only", "HEAD").split())
if files != sorted(WANT):
    fail(f"HEAD tracks {files}, want {sorted(WANT)}")
for name, text in WANT.items():
    if git("show", f"HEAD:{name}") != text:
        fail(f"{name} in the merge commit is not the wanted result")
if git("diff", "HEAD", "--name-only").strip():
    fail("tracked files have uncommitted changes")
if git("rev-parse", "-q", "--verify", "MERGE_HEAD", check=False).strip():
    fail("a merge is still in progress")
print("PASS")
