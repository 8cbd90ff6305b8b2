"""Build a copy with the agent's sources and the strict flags, then run events."""
import os
import shutil
import subprocess
import sys
import tempfile

# build where binaries may run: /tmp is mounted noexec in some sandboxes
SCRATCH = "/work" if os.access("/work", os.W_OK) else None


def fail(msg: str) -> None:
    print("FAIL:", msg)
    sys.exit(1)


with tempfile.TemporaryDirectory(prefix=".verify-", dir=SCRATCH) as tmp:
    for name in ("main.c", "registry.c", "registry.h"):
        shutil.copy(f"/work/{name}", tmp)
    shutil.copy("/work/Makefile", tmp)
    r = subprocess.run(["make", "CFLAGS=-O2 -Wall -Werror"], cwd=tmp, capture_output=True,
                       text=True, timeout=120)
    if r.returncode != 0:
        fail(f"make failed:\n{(r.stdout + r.stderr)[-1500:]}")
    for args in ([], ["a", "b"], ["start", "stop", "x y"]):
        out = subprocess.run([f"{tmp}/events", *args], capture_output=True, text=True, timeout=20)
        want = "".join(f"event {i}: {a}\n" for i, a in enumerate(args, 1))
        want += f"total {len(args) + 100}\n"
        if out.returncode != 0 or out.stdout != want:
            fail(f"events {args}: got {out.stdout!r}, want {want!r}")
print("PASS")
