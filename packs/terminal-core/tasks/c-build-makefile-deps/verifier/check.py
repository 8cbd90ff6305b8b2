"""Build a copy with the agent's Makefile, run rpn, then change a header and rebuild."""
import os
import shutil
import subprocess
import sys
import tempfile
import time

# build where binaries may run: /tmp is mounted noexec in some sandboxes
SCRATCH = "/work" if os.access("/work", os.W_OK) else None

SOURCES = ["Makefile", "main.c", "eval.c", "eval.h", "stack.c", "stack.h"]


def fail(msg: str) -> None:
    print("FAIL:", msg)
    sys.exit(1)


def make(tmp: str, *args: str) -> None:
    r = subprocess.run(["make", *args], cwd=tmp, capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        fail(f"make {' '.join(args)} failed:\n{(r.stdout + r.stderr)[-1500:]}")


def rpn(tmp: str, expr: str) -> tuple[int, str]:
    r = subprocess.run([f"{tmp}/rpn", expr], capture_output=True, text=True, timeout=20)
    return r.returncode, r.stdout.strip()


with tempfile.TemporaryDirectory(prefix=".verify-", dir=SCRATCH) as tmp:
    for name in SOURCES:
        shutil.copy(f"/work/{name}", tmp)
    make(tmp)
    for expr, want in (("3 4 + 2 *", "14"), ("10 2 8 * + 3 -", "23"), ("7 2 /", "3")):
        got = rpn(tmp, expr)
        if got != (0, want):
            fail(f"rpn {expr!r} gave {got}, want (0, {want!r})")
    make(tmp, "clean")
    left = sorted(f for f in os.listdir(tmp) if f == "rpn" or f.endswith(".o"))
    if left:
        fail(f"make clean left {left}")
    make(tmp)
    # shrink the stack in the header: stack.o and eval.o must both be rebuilt
    path = os.path.join(tmp, "stack.h")
    text = open(path).read().replace("#define STACK_MAX 64", "#define STACK_MAX 2")
    open(path, "w").write(text)
    later = time.time() + 10  # newer than every object, whatever the clock resolution
    os.utime(path, (later, later))
    make(tmp)
    got = rpn(tmp, "1 2 3 + +")
    if got[0] != 1:
        fail("after changing STACK_MAX in stack.h, `make` did not rebuild what includes it")
print("PASS")
