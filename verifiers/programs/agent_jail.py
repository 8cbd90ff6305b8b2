"""What the terminal runner's ``python3`` / ``bash`` / ``sh`` wrappers run for a program of
the agent's (``python3 /app/prog.py``, ``python3 -m pkg``, ``bash ./solve.sh``): argv is
the real interpreter and its arguments. Before it execs them, it confines itself and
everything it will start with Landlock (an unprivileged Linux security module, so it works
under bwrap's and docker's single sandbox uid): the verifier's folder, its logs folder, the
runner's wrappers and HOME are outside every path the program may open or write (a
verifier file the command names as an argument stays readable), and a Landlock domain
cannot read the memory, descriptors or environment of processes outside it (/proc/<pid>/
mem, fd, environ of the checker) nor, where the kernel scopes them, signal them. The
program gets a TMPDIR of its own and no verifier variable. A kernel without Landlock runs
the program unconfined and says so on stderr."""

import ctypes
import os
import stat
import sys

SYS_CREATE_RULESET, SYS_ADD_RULE, SYS_RESTRICT_SELF = 444, 445, 446
PR_SET_NO_NEW_PRIVS = 38
FILE_RIGHTS = (1 << 0) | (1 << 1) | (1 << 2)  # execute, write file, read file
TRUNCATE, IOCTL_DEV = 1 << 14, 1 << 15
HIDDEN_VARS = ("VERIFIER_DIR", "VERIFIER_LOGS", "TEST_DIR")


class PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def rights(abi: int) -> tuple[int, int]:
    """(every filesystem right this ABI handles, the rights that apply to a file)."""
    every = (1 << 13) - 1
    files = FILE_RIGHTS
    if abi >= 2:
        every |= 1 << 13  # refer
    if abi >= 3:
        every |= TRUNCATE
        files |= TRUNCATE
    if abi >= 5:
        every |= IOCTL_DEV
        files |= IOCTL_DEV
    return every, files


def allowed_paths(hidden: list[str], named: list[str]) -> list[tuple[str, bool]]:
    """(path, everything) pairs: all of / but /tmp, every entry of /tmp but the hidden ones,
    and (read only) the hidden files the command names."""
    out = [(os.path.join("/", n), True) for n in os.listdir("/") if n != "tmp"]
    for name in os.listdir("/tmp"):
        path = os.path.join("/tmp", name)
        if not any(path == h or h.startswith(path + "/") for h in hidden):
            out.append((path, True))
    out += [(p, False) for p in named]
    return out


def confine(hidden: list[str], named: list[str]) -> str:
    """Landlock this process (and what it will exec); '' or why it could not."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    abi = libc.syscall(SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    if abi < 0:
        return f"Landlock unavailable ({os.strerror(ctypes.get_errno())})"
    every, files = rights(abi)
    attr = (ctypes.c_uint64 * 3)(every, 0, 3 if abi >= 6 else 0)  # scoped: sockets, signals
    size = 24 if abi >= 6 else 8
    ruleset = libc.syscall(SYS_CREATE_RULESET, attr, ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        return f"Landlock ruleset refused ({os.strerror(ctypes.get_errno())})"
    for path, full in allowed_paths(hidden, named):
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            is_dir = stat.S_ISDIR(os.fstat(fd).st_mode)
            access = (every if is_dir else files) if full else (1 << 2)
            rule = PathBeneath(access, fd)
            libc.syscall(SYS_ADD_RULE, ruleset, 1, ctypes.byref(rule), ctypes.c_uint32(0))
        finally:
            os.close(fd)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return f"no_new_privs refused ({os.strerror(ctypes.get_errno())})"
    if libc.syscall(SYS_RESTRICT_SELF, ruleset, ctypes.c_uint32(0)) != 0:
        return f"Landlock restrict refused ({os.strerror(ctypes.get_errno())})"
    os.close(ruleset)
    return ""


def main() -> None:
    argv = sys.argv[1:]
    hidden = [p for p in os.environ.get("PALAESTRA_HIDDEN", "").split(":") if p.startswith("/")]
    named = []
    for arg in argv[1:]:
        path = os.path.realpath(arg) if arg.startswith("/") else ""
        if path and os.path.isfile(path) and any(path.startswith(h + "/") for h in hidden):
            named.append(path)
    why = confine(hidden, named)
    if why:
        sys.stderr.write(f"palaestra: {why}; the program runs unconfined\n")
    env = {k: v for k, v in os.environ.items() if k not in HIDDEN_VARS}
    env = {k: v for k, v in env.items() if not k.startswith("PALAESTRA_")}
    bindir = os.environ.get("PALAESTRA_BIN", "")
    env["PATH"] = ":".join(p for p in env.get("PATH", "").split(":") if p and p != bindir)
    tmp = os.environ.get("PALAESTRA_AGENT_TMP")
    if tmp:
        env["TMPDIR"] = tmp
    os.execve(argv[0], argv, env)


main()
