"""Build a copy of wordfreq.c with the Makefile's strict flags and run the program on fresh input."""
import collections
import re
import os
import shutil
import subprocess
import sys
import tempfile

# build where binaries may run: /tmp is mounted noexec in some sandboxes
SCRATCH = "/work" if os.access("/work", os.W_OK) else None

CFLAGS = "-std=gnu11 -O2 -Wall -Wextra -Werror"
TEXTS = [
    "The cat and the hat. THE END, and... the cat!\n",
    "b a c b a b\nzeta Zeta ZETA alpha\n",
    "",
]


def fail(msg: str) -> None:
    print("FAIL:", msg)
    sys.exit(1)


def reference(text: str) -> str:
    words = collections.Counter(w.lower() for w in re.findall(r"[A-Za-z]+", text))
    return "".join(f"{n} {w}\n" for w, n in sorted(words.items(), key=lambda kv: (-kv[1], kv[0])))


with tempfile.TemporaryDirectory(prefix=".verify-", dir=SCRATCH) as tmp:
    shutil.copy("/work/wordfreq.c", tmp)
    r = subprocess.run(["gcc", *CFLAGS.split(), "-o", "wordfreq", "wordfreq.c"], cwd=tmp,
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        fail(f"the build failed:\n{(r.stdout + r.stderr)[-1500:]}")
    for i, text in enumerate(TEXTS):
        out = subprocess.run([f"{tmp}/wordfreq"], input=text, capture_output=True, text=True,
                             timeout=20)
        if out.returncode != 0 or out.stdout != reference(text):
            fail(f"input {i}: got {out.stdout!r} (exit {out.returncode}), want {reference(text)!r}")
print("PASS")
