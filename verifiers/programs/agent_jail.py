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
the program unconfined and says so on stderr.

``--guard SPEC EXE ARGV...`` is the form exec_guard.py makes a process the checker started
execute instead of the agent's program (SPEC: JSON of the hidden paths, the wrappers' folder,
the agent's TMPDIR, since the checker may have cleared the environment): it confines itself
(unless it already is) and then executes EXE with ARGV, and it never runs the program
unconfined."""

import ctypes
import json
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
READ_FILE = 1 << 2


def named_paths(args: list[str], cwd: str, hidden: list[str]) -> list[tuple[str, int]]:
    """The hidden files and folders a command names (absolute, relative to `cwd`, or after
    an ``=``; through no symlink), each readable: a checker hands its own files to the
    program it runs."""
    roots = [os.path.realpath(h) for h in hidden]
    out: list[tuple[str, int]] = []
    for arg in args:
        for text in (arg, arg.split("=", 1)[1] if "=" in arg else ""):
            if not text:
                continue
            path = os.path.normpath(os.path.join(cwd, text))
            # only a path that names the file itself: a symlink of the agent's (``./prog
            # 42`` with /work/42 -> /tmp/verifier/expected.txt) is no grant
            if os.path.realpath(path) != path or not any(path.startswith(r + "/") for r in roots):
                continue
            if os.path.isfile(path):
                out.append((path, READ_FILE))
            elif os.path.isdir(path):
                out.append((path, READ_FILE | READ_DIR))
    return out


def allowed_paths(
    hidden: list[str], named: list[tuple[str, int]], listable: tuple[str, ...] = ()
) -> list[tuple[str, int]]:
    """(path, rights) pairs: every path but the hidden ones and the folders above them,
    the hidden paths the command names with their rights (`named_paths`), and the listing
    alone of a folder above a hidden path that is, or lies under, one of `listable` (a
    workspace holding tests). -1 stands for every right."""
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
    return out + named


def confine(hidden: list[str], named: list[tuple[str, int]], listable: tuple[str, ...] = ()) -> str:
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
            # never through a symlink: one under /tmp could name a hidden folder
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            is_dir = stat.S_ISDIR(os.fstat(fd).st_mode)
            access = (every if is_dir else files) if granted == -1 else granted
            access &= every if is_dir else files
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


def agent_env(environ: dict[str, str], bindir: str = "", tmp: str = "") -> dict[str, str]:
    """The environment of a program of the agent's: no verifier or runner variable, no
    wrapper folder on PATH, a TMPDIR of its own and its caches there (XDG_CACHE_HOME: the
    runner's HOME is hidden, and a build tool the checker runs on the agent's code caches
    under it, `go test`'s build cache for one)."""
    env = {k: v for k, v in environ.items() if k not in HIDDEN_VARS}
    env = {k: v for k, v in env.items() if not k.startswith("PALAESTRA_")}
    bindir = bindir or environ.get("PALAESTRA_BIN", "")
    env["PATH"] = ":".join(p for p in env.get("PATH", "").split(":") if p and p != bindir)
    tmp = tmp or environ.get("PALAESTRA_AGENT_TMP", "")
    if tmp:
        env["TMPDIR"] = tmp
        env["XDG_CACHE_HOME"] = os.path.join(tmp, ".cache")
    return env


def confined_already(hidden: list[str]) -> bool:
    """Whether a Landlock domain of ours already holds this process (a hidden folder that
    exists cannot be opened): a program a confined one starts needs no second layer."""
    for path in hidden:
        try:
            os.close(os.open(path, os.O_RDONLY | os.O_DIRECTORY))
            return False
        except PermissionError:
            return True
        except OSError:
            continue
    return False


def guarded(argv: list[str]) -> None:
    """``--guard SPEC EXE ARGV...`` (see the module doc)."""
    spec, exe, args = json.loads(argv[0]), argv[1], argv[2:] or [argv[1]]
    hidden = [p for p in spec["hidden"] if p.startswith("/")]
    if not confined_already(hidden):
        listable = tuple(spec.get("listable") or ())
        why = confine(hidden, named_paths(args[1:], os.getcwd(), hidden), listable)
        if why:
            sys.stderr.write(f"palaestra: {why}; the checker's program does not run\n")
            os._exit(126)
    env = agent_env(dict(os.environ), spec["bin"], spec["tmp"])
    try:
        os.execve(exe, args, env)
    except OSError as exc:
        sys.stderr.write(f"palaestra: {args[0]}: {exc.strerror}\n")
        os._exit(126)


def main() -> None:
    argv = sys.argv[1:]
    if argv[:1] == ["--guard"]:
        return guarded(argv[1:])
    hidden = [p for p in os.environ.get("PALAESTRA_HIDDEN", "").split(":") if p.startswith("/")]
    why = confine(hidden, named_paths(argv[1:], os.getcwd(), hidden))
    if why:
        sys.stderr.write(f"palaestra: {why}; the program runs unconfined\n")
    os.execve(argv[0], argv, agent_env(dict(os.environ)))


if __name__ == "__main__":  # a module of repo_worker.py's otherwise
    main()
