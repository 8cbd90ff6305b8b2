"""Run user_counts.py on a large fresh input under a time limit and compare the output."""
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile

# python3 from PATH: sys.executable can name a wrapper that a noexec /tmp cannot run
PYTHON = shutil.which("python3") or "/usr/bin/python3"
# CPU seconds, not wall time: a loaded machine slows a fix down, never speeds the original up
CPU_LIMIT_S = 3


def limit_cpu() -> None:
    resource.setrlimit(resource.RLIMIT_CPU, (CPU_LIMIT_S, CPU_LIMIT_S))


def fail(msg: str) -> None:
    print("FAIL:", msg)
    sys.exit(1)


def reference(lines: list[str]) -> str:
    counts: dict[str, int] = {}
    for line in lines:
        user = line.strip()
        if user:
            counts[user] = counts.get(user, 0) + 1
    return "".join(f"{u} {n}\n" for u, n in counts.items())


rng = random.Random(2024)
big = [f"user{rng.randint(1, 20000):05d}\n" for _ in range(100000)]
big[10:10] = ["\n", "  \n", " user00007 \n"]
small = ["b\n", "a\n", "\n", "b\n", "c\n", "a\n", "b"]
with tempfile.TemporaryDirectory() as tmp:
    for name, lines in (("small", small), ("big", big)):
        path = os.path.join(tmp, name)
        with open(path, "w") as fh:
            fh.writelines(lines)
        try:
            r = subprocess.run([PYTHON, "-B", "/work/user_counts.py", path],
                               capture_output=True, text=True, timeout=30,
                               preexec_fn=limit_cpu)
        except subprocess.TimeoutExpired:
            fail(f"{name} input: still running after 30 s")
        if r.returncode in (-signal.SIGXCPU, -signal.SIGKILL):
            fail(f"{name}: needed more than {CPU_LIMIT_S} s of CPU time")
        if r.returncode != 0:
            fail(f"{name} input: exit status {r.returncode}: {r.stderr[-300:]}")
        if r.stdout != reference(lines):
            fail(f"{name} input: the output differs from the original program's")
print("PASS")
