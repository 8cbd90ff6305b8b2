"""The terminal runner's exec guard: every program the checker starts that runs the agent's
code runs under Landlock, however it is started (``./solution``, ``make``, a test's
``subprocess.run(["/app/a.out"])``), not only those started through the runner's
``python3``/``bash`` wrappers.

How: the runner starts ``test.sh`` as a ptrace tracee (PTRACE_SEIZE, following forks,
vforks, clones and execs). A tracee stops after every ``execve``, before the new program's
first instruction; there the guard reads what was started (``/proc/<pid>/exe``,
``cmdline``, ``cwd``) and, where `confines` says so, makes the stopped process ``execve``
agent_jail.py in its ``--guard`` form instead, with the same argv and environment: the jail
confines itself (no verifier folder, logs, wrappers or runner HOME; the hidden paths the
command names stay readable) and then executes the program. A confined process's children
are confined (Landlock domains are inherited); nothing of a confined process is looked at
again. The injection: a ``syscall`` instruction at the entry point, then, from the
``execve``'s syscall-exit stop, register edits that run ``mmap`` (room for the jail's
argv; the original argv and environment pointers are reused) and the jail's ``execve``,
so no code of the program runs before it is confined; an injected call that fails kills
the process.

Why ptrace and not a wrapper per name: the checker executes files directly, through
``posix_spawn``, from static binaries and from build tools' recipes; only the kernel sees
every exec. Every process of the checker's tree is traced, so none can be ptrace-attached
by another (a tracee has one tracer; the runner is non-dumpable). x86_64 only;
elsewhere, or where ptrace is refused, `available` says why and the runner goes on with
the wrappers alone.
"""

import contextlib
import ctypes
import json
import os
import platform
import re
import signal
import struct

PTRACE_PEEKDATA, PTRACE_POKEDATA, PTRACE_CONT = 2, 5, 7
PTRACE_GETREGS, PTRACE_SETREGS, PTRACE_SYSCALL = 12, 13, 24
PTRACE_SEIZE, PTRACE_GETEVENTMSG, PTRACE_LISTEN = 0x4206, 0x4201, 0x4208
OPTIONS = 0x1 | 0x2 | 0x4 | 0x8 | 0x10 | 0x100000  # sysgood, fork, vfork, clone, exec, exitkill
EVENT_FORK, EVENT_VFORK, EVENT_CLONE, EVENT_EXEC, EVENT_STOP = 1, 2, 3, 4, 128
SYSCALL_STOP = signal.SIGTRAP | 0x80
GROUP_STOPS = (signal.SIGSTOP, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU)
WALL = 0x40000000
PR_SET_DUMPABLE = 4
SYS_EXECVE, SYS_MMAP = 59, 9
PROT_RW, MAP_ANON_PRIVATE = 0x3, 0x22
AT_EXECFN = 31
SYS_LANDLOCK_CREATE_RULESET = 444  # with flag 1: the ABI version
MAX_ARGC = 1 << 20


def words(text: str) -> list[str]:
    return text.split()


# Tracee states.
TRUSTED, CONFINED = "trusted", "confined"
AWAIT_EXIT, AWAIT_MMAP, AWAIT_ROOM = "await-exit", "await-mmap", "await-room"
AWAIT_ENTRY, AWAIT_RESULT = "await-entry", "await-result"
INJECTING = (AWAIT_EXIT, AWAIT_MMAP, AWAIT_ROOM, AWAIT_ENTRY, AWAIT_RESULT)

# Tools that run no code of their own arguments or working directory: the checker may run
# them on the agent's files, unconfined (they may write the verifier's logs).
SAFE_TOOLS = frozenset(
    words(
        "cat cp mv rm ls mkdir rmdir touch chmod ln head tail wc sort uniq cut tr tee echo "
        "printf test [ true false sleep date stat du df basename dirname realpath readlink "
        "grep diff cmp comm md5sum sha1sum sha256sum sha512sum b2sum cksum base64 od xxd "
        "hexdump tar gzip gunzip zcat xz unxz bzip2 bunzip2 unzip file jq curl wget seq tac "
        "nl paste join split fold expand column iconv id whoami uname hostname env timeout "
        "nohup nice stdbuf xargs find ps kill pkill pgrep mktemp install truncate shuf expr "
        "numfmt nproc sync strings"
    )
)
# Interpreters whose leading option takes the program text: code of the checker's own.
CODE_FLAGS = (
    (re.compile(r"(ba|da|z|k|a)?sh|busybox"), re.compile(r"-[a-zA-Z]*c[a-zA-Z]*")),
    (re.compile(r"python[0-9.]*"), re.compile(r"-c")),
    (re.compile(r"(perl|ruby|node|nodejs|php)[0-9.]*"), re.compile(r"-e|-E|-r")),
)
VALUE_FLAGS = frozenset(("-X", "-W", "-m", "-o"))  # python/shell options with a value
# Variables that name where a program loads code from: naming the agent's folders there
# runs its code.
CODE_VARS = frozenset(
    words(
        "PYTHONPATH PYTHONHOME PYTHONSTARTUP PYTHONUSERBASE NODE_PATH NODE_OPTIONS CLASSPATH "
        "PERL5LIB PERLLIB PERL5OPT RUBYLIB RUBYOPT GEM_HOME GEM_PATH LD_PRELOAD "
        "LD_LIBRARY_PATH LD_AUDIT BASH_ENV ENV JAVA_TOOL_OPTIONS _JAVA_OPTIONS GOPATH GOFLAGS "
        "R_LIBS R_PROFILE_USER"
    )
)


class Injection:
    """What the jail's execve needs: the entry point holding our ``syscall``, the jail's
    own argv (the program last), the program's argv pointers and its environment."""

    def __init__(self, rip: int, strings: list[str], pointers: list[int], envp: int) -> None:
        self.rip, self.pointers, self.envp = rip, pointers, envp
        self.strings = [s.encode("utf-8", "surrogateescape") + b"\0" for s in strings]

    def size(self) -> int:
        text = sum(len(s) for s in self.strings)
        return text + 8 + 8 * (len(self.strings) + len(self.pointers) + 1)

    def layout(self, base: int) -> tuple[bytes, int, int]:
        """(the bytes to write at `base`, the path's address, the argv array's address)."""
        offsets, text = [], b""
        for s in self.strings:
            offsets.append(len(text))
            text += s
        text += b"\0" * (-len(text) % 8)
        table = struct.pack(
            f"<{len(offsets) + len(self.pointers) + 1}Q",
            *[base + o for o in offsets],
            *self.pointers,
            0,
        )
        return text + table, base, base + len(text)


class Regs(ctypes.Structure):
    """x86_64 ``struct user_regs_struct``."""

    _fields_ = [
        (name, ctypes.c_ulonglong)
        for name in words(
            "r15 r14 r13 r12 rbp rbx r11 r10 r9 r8 rax rcx rdx rsi rdi orig_rax rip cs "
            "eflags rsp ss fs_base gs_base ds es fs gs"
        )
    ]


class Policy:
    """Where the checker's own files are, where the agent's may be, and the jail to run.

    `agent`: the workspace and every folder a program may write in the verification
    sandbox (/tmp…): what the agent's code wrote or built there, or copied from the
    workspace, is the agent's too. `own` is carved out of it (the verifier's folder, its
    logs, the wrappers, the runner's HOME)."""

    def __init__(self, own: list[str], agent: list[str], jail: list[str]) -> None:
        self.own = [os.path.realpath(p) for p in own if p]
        self.agent = [os.path.realpath(p) for p in agent if p]
        self.jail = jail  # argv of the jail's --guard form, before the program and its argv

    def agents(self, path: str) -> bool:
        """Whether `path` (absolute, normalised) is in the agent's folders."""
        return bool(path) and _under(path, self.agent) and not _under(path, self.own)


def _under(path: str, roots: list[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _mentions(arg: str, policy: Policy) -> bool:
    """Whether `arg` holds a path of the agent's anywhere (``--out=/app/x``, ``-I/app``,
    ``a:/app/lib``)."""
    for piece in re.split(r"[=:,;\s]", arg):
        at = piece.find("/")
        if at >= 0 and policy.agents(os.path.normpath(piece[at:])):
            return True
    return False


def _program_arg(name: str, args: list[str]) -> tuple[bool, str]:
    """(the interpreter runs code given inline, its first operand)."""
    i = 0
    while i < len(args) and args[i].startswith("-") and args[i] != "-":
        for names, flags in CODE_FLAGS:
            if names.fullmatch(name) and flags.fullmatch(args[i]):
                return True, ""
        if args[i] == "--":
            i += 1
            break
        i += 2 if args[i] in VALUE_FLAGS else 1
    return False, args[i] if i < len(args) else ""


class Started:
    """What a stopped tracee just executed, read from /proc and its stack."""

    def __init__(
        self,
        exe: str,
        argv: list[str],
        cwd: str,
        execfn: str = "",
        stdin: str = "",
        env: dict[str, str] | None = None,
    ) -> None:
        self.exe, self.argv, self.cwd = exe, argv, cwd
        self.execfn = os.path.normpath(os.path.join(cwd, execfn)) if execfn else ""
        self.stdin = stdin  # the file on its stdin, if a file
        self.env = env or {}


def confines(started: Started, policy: Policy) -> bool:
    """Whether a program an unconfined (checker's) process just executed is the agent's to
    confine: the file, or the script the exec named (whatever its ``#!`` line runs), is in
    the agent's folders; or it is not the checker's own program (a file or script of the
    verifier's, an interpreter's inline code, a tool of `SAFE_TOOLS`) and its stdin file, an
    argument, a code-path variable (`CODE_VARS`) or its working directory is the agent's."""
    exe, argv, cwd = started.exe, started.argv, started.cwd
    if _under(exe, policy.own):
        return False
    if policy.agents(exe) or policy.agents(started.execfn):
        return True
    name = os.path.basename(exe)
    inline, operand = _program_arg(name, argv[1:])
    if inline:
        return False
    if operand and _under(os.path.realpath(os.path.join(cwd, operand)), policy.own):
        return False
    if name in SAFE_TOOLS:
        return False
    if policy.agents(started.stdin):
        return True
    args = [a if a.startswith("-") else os.path.normpath(os.path.join(cwd, a)) for a in argv[1:]]
    if any(_mentions(a, policy) for a in args):
        return True
    if any(_mentions(started.env.get(k, ""), policy) for k in CODE_VARS):
        return True
    return policy.agents(os.path.realpath(cwd))


def available() -> str:
    """'' where the guard can run here (x86_64, Landlock), else why not. Whether ptrace is
    allowed shows at the first `Tracer.fork` (`refused`)."""
    if platform.machine() not in ("x86_64", "amd64"):
        return f"the exec guard supports x86_64 only (this is {platform.machine()})"
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    if libc.syscall(SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1)) < 0:
        return "Landlock is unavailable"
    return ""


class Tracer:
    """Runs one command tree under the guard (see the module doc)."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.libc.ptrace.restype = ctypes.c_long
        self.libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
        self.state: dict[int, str] = {}
        self.held: set[int] = set()  # new tracees whose parent's event is not in yet
        self.pending: dict[int, Injection] = {}
        self.confined = 0
        self.refused = ""

    def ptrace(self, request: int, pid: int, addr: int = 0, data: int = 0) -> int:
        ctypes.set_errno(0)
        out = self.libc.ptrace(request, pid, ctypes.c_void_p(addr), ctypes.c_void_p(data))
        if out == -1 and ctypes.get_errno():
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
        return int(out)

    def resume(self, pid: int, sig: int = 0) -> None:
        request = PTRACE_SYSCALL if self.state.get(pid) in INJECTING else PTRACE_CONT
        with contextlib.suppress(OSError):  # it died meanwhile: its exit is reported next
            self.ptrace(request, pid, 0, sig)

    def fork(self) -> int:
        """os.fork, the child traced from its start: 0 in the child, its pid here. Where
        ptrace is refused the child runs untraced and `refused` says why."""
        ready_r, ready_w = os.pipe()
        go_r, go_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(ready_r)
            os.close(go_w)
            # a child of the non-dumpable runner is non-dumpable: nothing could trace it
            self.libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
            os.write(ready_w, b"x")
            os.read(go_r, 1)
            os.close(ready_w)
            os.close(go_r)
            return 0
        os.close(ready_w)
        os.close(go_r)
        os.read(ready_r, 1)
        os.close(ready_r)
        try:
            self.ptrace(PTRACE_SEIZE, pid, 0, OPTIONS)
            self.state[pid] = TRUSTED
        except OSError as exc:
            self.refused = f"ptrace refused ({exc.strerror})"
        os.write(go_w, b"x")
        os.close(go_w)
        return pid

    def run(self, argv: list[str], cwd: str, env: dict[str, str]) -> int:
        """Run a command under the guard; its exit status (negative: the signal)."""
        pid = self.fork()
        if pid == 0:  # pragma: no cover - the child
            try:
                null = os.open(os.devnull, os.O_RDONLY)
                os.dup2(null, 0)
                os.chdir(cwd)
                os.execve(argv[0], argv, env)
            finally:
                os._exit(127)
        return self.wait(pid)

    def wait(self, pid: int) -> int:
        """Serve the tree's stops until `pid` (a child of `fork`) ends; its exit status."""
        if self.refused:
            return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        return self.loop(pid)

    def loop(self, root: int) -> int:
        while True:
            try:
                pid, status = os.waitpid(-1, WALL)
            except ChildProcessError:
                return -signal.SIGKILL
            if os.WIFEXITED(status) or os.WIFSIGNALED(status):
                self.state.pop(pid, None)
                if pid == root:
                    return os.waitstatus_to_exitcode(status)
                continue
            if os.WIFSTOPPED(status):
                self.stopped(pid, os.WSTOPSIG(status), status >> 16)

    def stopped(self, pid: int, sig: int, event: int) -> None:
        if event in (EVENT_FORK, EVENT_VFORK, EVENT_CLONE):
            try:
                child = self.event_message(pid)
            except OSError:  # it was killed meanwhile: its exit comes next
                return
            parent = self.state.get(pid, TRUSTED)
            self.state[child] = CONFINED if parent == CONFINED else TRUSTED
            if child in self.held:
                self.held.discard(child)
                self.resume(child)
            self.resume(pid)
        elif event == EVENT_EXEC:
            with contextlib.suppress(OSError):  # a thread's exec: its old id ends unseen
                former = self.event_message(pid)
                if former != pid:
                    self.state.pop(former, None)
            self.executed(pid)
        elif event == EVENT_STOP:
            if sig in GROUP_STOPS:
                with contextlib.suppress(OSError):
                    self.ptrace(PTRACE_LISTEN, pid)
            elif pid not in self.state:
                self.held.add(pid)  # resumed once its parent's fork event names it
            else:
                self.resume(pid)
        elif sig == SYSCALL_STOP:
            self.syscall_stop(pid)
        else:
            self.resume(pid, sig)

    def event_message(self, pid: int) -> int:
        msg = ctypes.c_ulong()
        self.ptrace(PTRACE_GETEVENTMSG, pid, 0, ctypes.addressof(msg))
        return int(msg.value)

    def executed(self, pid: int) -> None:
        state = self.state.get(pid, TRUSTED)
        if state == CONFINED:
            return self.resume(pid)
        if state in INJECTING:  # the jail is running: it confines itself before anything
            self.state[pid] = CONFINED
            self.confined += 1
            return self.resume(pid)
        try:
            started = self.started(pid)
        except OSError:  # nothing to judge it by: it does not run
            return self.kill(pid)
        if not confines(started, self.policy):
            return self.resume(pid)
        try:
            self.inject(pid, started.exe)
        except OSError:
            self.kill(pid)

    def started(self, pid: int) -> Started:
        proc = f"/proc/{pid}"
        with open(f"{proc}/cmdline", "rb") as f:
            argv = [a.decode("utf-8", "surrogateescape") for a in f.read().split(b"\0")[:-1]]
        with open(f"{proc}/environ", "rb") as f:
            pairs = [v.decode("utf-8", "surrogateescape") for v in f.read().split(b"\0")]
        env = dict(v.split("=", 1) for v in pairs if "=" in v)
        stdin = ""
        with contextlib.suppress(OSError):
            stdin = os.readlink(f"{proc}/fd/0")
        exe, cwd = os.readlink(f"{proc}/exe"), os.readlink(f"{proc}/cwd")
        stdin = os.path.normpath(stdin) if stdin.startswith("/") else ""
        return Started(exe, argv, cwd, self.execfn(pid), stdin, env)

    def inject(self, pid: int, exe: str) -> None:
        """Put a ``syscall`` at the new program's entry point and keep what the jail's argv
        needs; at the exec's syscall-exit stop the registers run ``mmap`` (room for that
        argv: the stack's mapping has no spare room), then ``execve`` (`syscall_stop`)."""
        if not exe or exe.endswith(" (deleted)"):
            raise OSError("the program's file is unknown")
        regs = self.getregs(pid)
        argc = self.peek(pid, regs.rsp)
        if argc > MAX_ARGC:
            raise OSError("too many arguments")
        pointers = [self.peek(pid, regs.rsp + 8 * (i + 1)) for i in range(argc)]
        envp = regs.rsp + 8 * (argc + 2)
        word = self.peek(pid, regs.rip)
        self.poke(pid, regs.rip, struct.pack("<Q", (word & ~0xFFFF) | 0x050F))  # syscall
        self.pending[pid] = Injection(regs.rip, [*self.policy.jail, exe], pointers, envp)
        self.state[pid] = AWAIT_EXIT
        self.resume(pid)

    def syscall_stop(self, pid: int) -> None:
        state = self.state.get(pid)
        try:
            job = self.pending[pid] if state in (AWAIT_EXIT, AWAIT_MMAP) else None
            if job is not None and state == AWAIT_EXIT:  # the original execve returns
                self.call(pid, job.rip, SYS_MMAP, 0, job.size(), PROT_RW, MAP_ANON_PRIVATE, -1)
                self.state[pid] = AWAIT_MMAP
            elif job is not None and state == AWAIT_MMAP:
                self.state[pid] = AWAIT_ROOM
            elif state == AWAIT_ROOM:  # mmap's answer: the argv there, then the jail's execve
                job = self.pending.pop(pid)
                base = self.getregs(pid).rax
                if base >= -4096 & 0xFFFFFFFFFFFFFFFF:
                    raise OSError("mmap failed")
                blob, path, argv = job.layout(base)
                self.poke(pid, base, blob)
                self.call(pid, job.rip, SYS_EXECVE, path, argv, job.envp)
                self.state[pid] = AWAIT_ENTRY
            elif state == AWAIT_ENTRY:
                self.state[pid] = AWAIT_RESULT
            elif state == AWAIT_RESULT:  # an exit stop, not an exec event: it failed
                return self.kill(pid)
        except (OSError, KeyError):
            return self.kill(pid)
        self.resume(pid)

    def call(self, pid: int, rip: int, nr: int, *args: int) -> None:
        """Make the stopped tracee run syscall `nr` at `rip` (a ``syscall`` instruction)."""
        regs = self.getregs(pid)
        regs.rax, regs.rip = nr, rip
        for name, value in zip(("rdi", "rsi", "rdx", "r10", "r8", "r9"), args, strict=False):
            setattr(regs, name, value & 0xFFFFFFFFFFFFFFFF)
        self.ptrace(PTRACE_SETREGS, pid, 0, ctypes.addressof(regs))

    def kill(self, pid: int) -> None:
        self.state[pid] = CONFINED  # whatever is left of it runs nothing
        os.kill(pid, signal.SIGKILL)
        self.resume(pid)

    def execfn(self, pid: int) -> str:
        """The path the exec named (AT_EXECFN): a script's own path, whose interpreter is
        what /proc/<pid>/exe shows."""
        with open(f"/proc/{pid}/auxv", "rb") as f:
            auxv = f.read()
        pairs = struct.unpack(f"<{len(auxv) // 8}Q", auxv[: len(auxv) // 8 * 8])
        addr = dict(zip(pairs[::2], pairs[1::2], strict=False)).get(AT_EXECFN, 0)
        raw = b""
        while addr and b"\0" not in raw and len(raw) < 4096:
            raw += struct.pack("<Q", self.peek(pid, addr + len(raw)))
        return raw.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")

    def getregs(self, pid: int) -> Regs:
        regs = Regs()
        self.ptrace(PTRACE_GETREGS, pid, 0, ctypes.addressof(regs))
        return regs

    def peek(self, pid: int, addr: int) -> int:
        return self.ptrace(PTRACE_PEEKDATA, pid, addr) & 0xFFFFFFFFFFFFFFFF

    def poke(self, pid: int, addr: int, data: bytes) -> None:
        with contextlib.suppress(OSError):  # one write where /proc/<pid>/mem is open to us
            fd = os.open(f"/proc/{pid}/mem", os.O_WRONLY | os.O_CLOEXEC)
            try:
                if os.pwrite(fd, data, addr) == len(data):
                    return
            finally:
                os.close(fd)
        data += b"\0" * (-len(data) % 8)
        for i in range(0, len(data), 8):
            (word,) = struct.unpack("<Q", data[i : i + 8])
            self.ptrace(PTRACE_POKEDATA, pid, addr + i, word)


def jail_argv(
    python: str,
    jail_source: str,
    hidden: list[str],
    wrappers: str,
    tmp: str,
    listable: tuple[str, ...] = (),
) -> list[str]:
    """The argv of agent_jail.py's ``--guard`` form before the program and its argv
    (`listable`: folders above hidden files whose listing stays open, agent_jail.py)."""
    spec = json.dumps({"hidden": hidden, "bin": wrappers, "tmp": tmp, "listable": listable})
    return [python, "-I", "-B", "-c", jail_source, "--guard", spec]
