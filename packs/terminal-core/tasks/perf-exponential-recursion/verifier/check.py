"""Run paths.py on fresh grids (up to 60x60) under a time limit; compare with a DP reference."""
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


def reference(grid: list[str]) -> int:
    h, w = len(grid), len(grid[0])
    ways = [[0] * (w + 1) for _ in range(h + 1)]
    for r in range(h - 1, -1, -1):
        for c in range(w - 1, -1, -1):
            if grid[r][c] == "#":
                ways[r][c] = 0
            elif r == h - 1 and c == w - 1:
                ways[r][c] = 1
            else:
                ways[r][c] = ways[r + 1][c] + ways[r][c + 1]
    return ways[0][0]


def random_grid(rng: random.Random, h: int, w: int, density: float) -> list[str]:
    rows = [["#" if rng.random() < density else "." for _ in range(w)] for _ in range(h)]
    rows[0][0] = rows[h - 1][w - 1] = "."
    return ["".join(r) for r in rows]


rng = random.Random(77)
grids = [
    ["....", ".#..", "...#", "#..."],
    random_grid(rng, 60, 60, 0.08),
    random_grid(rng, 45, 60, 0.05),
    ["." * 60 for _ in range(60)],
    ["#.", ".."],
    ["."],
    [".#", "#."],
]
with tempfile.TemporaryDirectory() as tmp:
    for i, grid in enumerate(grids):
        path = os.path.join(tmp, f"grid{i}.txt")
        with open(path, "w") as fh:
            fh.write("\n".join(grid) + "\n")
        try:
            r = subprocess.run([PYTHON, "-B", "/work/paths.py", path],
                               capture_output=True, text=True, timeout=30,
                               preexec_fn=limit_cpu)
        except subprocess.TimeoutExpired:
            fail(f"grid {i} ({len(grid)}x{len(grid[0])}): still running after 30 s")
        if r.returncode in (-signal.SIGXCPU, -signal.SIGKILL):
            fail(f"grid {i} ({len(grid)}x{len(grid[0])}): needed more than {CPU_LIMIT_S} s of CPU time")
        want = reference(grid)
        if r.returncode != 0 or r.stdout.strip() != str(want):
            fail(f"grid {i}: printed {r.stdout.strip()[:80]!r} (exit {r.returncode}), want {want}")
    if reference(grids[1]) < 10**20:
        fail("fixture problem: the big grid's answer is too small")
print("PASS")
