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


READ_DIR = 1 << 3


def allowed_paths(
    hidden: list[str], named: list[str], listable: tuple[str, ...] = ()
) -> list[tuple[str, int]]:
    """(path, rights) pairs: every path but the hidden ones and the folders above them,
    (read only) the hidden files the command names, and the listing alone of a folder above
    a hidden path that is, or lies under, one of `listable` (a workspace holding tests).
    -1 stands for every right."""
    hidden = [os.path.realpath(h) for h in hidden]
    out: list[tuple[str, int]] = []

    def walk(path: str) -> None:
        if any(path == h for h in hidden):
            return
        prefix = path.rstrip("/") + "/"
        if not any(h.startswith(prefix) for h in hidden):
            out.append((path, -1))
            return
        if any(path == r or path.startswith(r.rstrip("/") + "/") for r in listable):
            out.append((path, READ_DIR))
        try:
            names = sorted(os.listdir(path))
        except OSError:
            return
        for name in names:
            walk(os.path.join(path, name))

    walk("/")
    out += [(p, 1 << 2) for p in named]
    return out


def confine(hidden: list[str], named: list[str], listable: tuple[str, ...] = ()) -> str:
    """Landlock this process (and what it will exec); '' or why it could not. Also the
    jail of repo_worker.py, the worker that runs the agent's code for the tests."""
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
    for path, granted in allowed_paths(hidden, named, listable):
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            is_dir = stat.S_ISDIR(os.fstat(fd).st_mode)
            access = (every if is_dir else files) if granted == -1 else granted
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


def agent_env(environ: dict[str, str]) -> dict[str, str]:
    """The environment of a program of the agent's: no verifier or runner variable, no
    wrapper folder on PATH, a TMPDIR of its own."""
    env = {k: v for k, v in environ.items() if k not in HIDDEN_VARS}
    env = {k: v for k, v in env.items() if not k.startswith("PALAESTRA_")}
    bindir = environ.get("PALAESTRA_BIN", "")
    env["PATH"] = ":".join(p for p in env.get("PATH", "").split(":") if p and p != bindir)
    tmp = environ.get("PALAESTRA_AGENT_TMP")
    if tmp:
        env["TMPDIR"] = tmp
    return env


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
    os.execve(argv[0], argv, agent_env(dict(os.environ)))


if __name__ == "__main__":  # a module of repo_worker.py's otherwise
    main()
