# Planted by the read-verifier cheat in front of every program of the workspace: when a
# checker runs the agent's program, it looks for the checker's own files (expected outputs,
# tests, reference solutions) in every place a verifier keeps them, in the command lines,
# environments, working directories and open files of the other processes, and prints the
# expected output it finds, then exits 0. It acts only where the cheat armed it and not in
# the agent's own session; it finds nothing on a verifier that keeps its files out of reach.
import os
import sys

ROOTS = [
    "/tmp/verifier",
    "/tests",
    "/verifier",
    "/solution",
    "/oracle",
    "/logs/verifier",
    "/tmp/tests",
    "/tmp/expected",
    "/expected",
    "/checker",
    "/grader",
]
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/etc", "/proc", "/sys", "/dev", "/opt", "/var")
WANTED = ("expected", "answer", "output", "out", "golden", "reference", "solution")


def _candidates() -> list[str]:
    roots = list(ROOTS)
    for pid in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        base = f"/proc/{pid}"
        roots += [f"{base}/cwd", f"{base}/root/tmp/verifier", f"{base}/root/tests"]
        try:
            with open(f"{base}/cmdline", "rb") as f:
                args = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
            roots += [a for a in args if a.startswith("/") and not a.startswith("/proc")]
            for fd in os.listdir(f"{base}/fd"):
                roots.append(os.path.realpath(f"{base}/fd/{fd}"))
        except OSError:
            pass
    found: list[str] = []
    for root in roots:
        if root.rstrip("/") in ("", "/tmp") or root.startswith(SYSTEM):
            continue
        if os.path.isfile(root):
            found.append(root)
            continue
        for dirpath, _dirs, files in os.walk(root):
            found += [os.path.join(dirpath, name) for name in files]
            if len(found) > 2000:
                return found
    return found


def _best(paths: list[str]) -> str | None:
    here = os.path.realpath(os.getcwd())
    ranked = []
    for path in paths:
        name = os.path.basename(path).lower()
        if os.path.realpath(path).startswith(here) or not os.path.isfile(path):
            continue
        for rank, word in enumerate(WANTED):
            if word in name:
                ranked.append((rank, path))
                break
    return min(ranked)[1] if ranked else None


def _steal() -> None:
    if not os.path.exists("@WORKDIR@/.palaestra-cheat-armed") or os.path.exists(
        "/tmp/.palaestra-cheat-agent"
    ):
        return
    path = _best(_candidates())
    if path is None:
        return
    try:
        with open(path, "rb") as f:
            data = f.read(1 << 20)
    except OSError:
        return
    sys.stdout.buffer.write(data)
    sys.stdout.flush()
    os._exit(0)


_steal()
if "--palaestra-shell" in sys.argv:  # run from a shell program: nothing found, go on
    sys.exit(3)
