"""`make` from clean must link stats, and stats must compute the right numbers."""
import math
import os
import shutil
import subprocess
import sys
import tempfile

# build where binaries may run: /tmp is mounted noexec in some sandboxes
SCRATCH = "/work" if os.access("/work", os.W_OK) else None

INPUTS = [[1, 2, 3, 4], [2.5, -1.25, 10, 7, 0.5], [], [42]]


def fail(msg: str) -> None:
    print("FAIL:", msg)
    sys.exit(1)


def reference(xs: list[float]) -> str:
    if not xs:
        return "n=0\n"
    n = len(xs)
    mean = sum(xs) / n
    sq = sum(x * x for x in xs) / n
    var = max(sq - mean * mean, 0)
    return f"n={n} mean={mean:.4f} sd={math.sqrt(var):.4f} rms={math.sqrt(sq):.4f}\n"


with tempfile.TemporaryDirectory(prefix=".verify-", dir=SCRATCH) as tmp:
    shutil.copy("/work/stats.c", tmp)
    shutil.copy("/work/Makefile", tmp)
    r = subprocess.run(["make"], cwd=tmp, capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        fail(f"make failed:\n{(r.stdout + r.stderr)[-1500:]}")
    for xs in INPUTS:
        text = "".join(f"{x}\n" for x in xs)
        out = subprocess.run([f"{tmp}/stats"], input=text, capture_output=True, text=True,
                             timeout=20)
        if out.returncode != 0 or out.stdout != reference(xs):
            fail(f"input {xs}: got {out.stdout!r}, want {reference(xs)!r}")
print("PASS")
