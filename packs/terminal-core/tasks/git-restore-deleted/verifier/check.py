"""One new commit on the untouched history restores the file's last contents, nothing else."""
import os
import subprocess
import sys

ORIGINAL_TIP = "d7083958f5628aa06776e644e7da722f92f94ea1"
WANT = "API_KEY=changeme\nDB_PASSWORD=changeme\nSMTP_TOKEN=changeme\n"
ENV = {**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"}


def git(*args: str) -> str:
    r = subprocess.run(
        ["git", "-c", "safe.directory=*", "-C", "/work", *args],
        capture_output=True, text=True, env=ENV, timeout=30,
    )
    if r.returncode != 0:
        fail(f"git {' '.join(args)}: {r.stderr.strip()}")
    return r.stdout


def fail(msg: str) -> None:
    print("FAIL:", msg)
    sys.exit(1)


if git("rev-parse", "--abbrev-ref", "HEAD").strip() != "main":
    fail("HEAD is not on branch main")
if git("rev-parse", "HEAD~1").strip() != ORIGINAL_TIP:
    fail(f"HEAD~1 is not the original tip {ORIGINAL_TIP[:12]}: make exactly one new commit on top of the history")
if git("log", "-1", "--format=%s").strip() != "Restore secrets.example":
    fail("the new commit's message is not 'Restore secrets.example'")
changed = git("diff", "--name-status", "HEAD~1", "HEAD").split("\n")
if [c for c in changed if c] != ["A\tconfig/secrets.example"]:
    fail(f"the new commit should only add config/secrets.example, it changes {changed}")
if git("show", "HEAD:config/secrets.example") != WANT:
    fail("config/secrets.example in the commit does not have its last contents")
if git("diff", "HEAD", "--name-only").strip():
    fail("tracked files have uncommitted changes")
print("PASS")
