"""The sandbox's seccomp filter, assembled as classic BPF in pure Python (no libseccomp).

`filter_bytes()` is a ``struct sock_filter[]`` in native byte order, what
``bwrap --seccomp FD`` reads from FD (and what ``prctl(PR_SET_SECCOMP,
SECCOMP_MODE_FILTER, &sock_fprog)`` takes).  The program:

1. loads ``seccomp_data.arch``; an architecture other than the host's (x86_64 or
   aarch64) kills the process -- this closes the i386 ``int 0x80`` / arm32 compat
   syscall tables, whose numbers differ, so 32-bit binaries cannot run in a sandbox;
2. on x86_64, a syscall number with the x32 bit (``nr >= 0x40000000``) fails with ENOSYS;
3. the denied syscalls (`DENIED`: ptrace, process_vm_readv/writev, bpf, perf_event_open,
   userfaultfd, the key-management calls, the mount APIs old and new, kexec, kernel
   modules) fail with EPERM;
4. io_uring (a large and often-exploited kernel surface) and the calls that reach kernel
   budgets counted per host uid, which every sandbox of that uid shares (`UNAVAILABLE`:
   inotify/fanotify instances and watches, POSIX message queue bytes), fail with ENOSYS,
   the answer that makes libraries (libuv, coreutils' ``tail -f``) fall back to plain
   syscalls or polling;
5. ``ioctl(fd, TIOCSTI | TIOCLINUX, ...)`` fails with EPERM (only the low 32 bits of
   the request are compared: the kernel ignores the upper ones, so setting them cannot
   bypass the check);
6. everything else is allowed.

A deny-list, not an allow-list: the sandboxes run arbitrary toolchains (gcc, node, the JVM…)
and an allow-list that misses one syscall breaks them in ways that look like task failures.
Namespace creation is stopped by bwrap's ``--disable-userns`` and the missing capabilities,
not here (the docker profile, `docker_profile`, has no bwrap behind it and refuses it too).
"""

from __future__ import annotations

import errno
import functools
import os
import platform
import struct
import sys

AUDIT_ARCH_X86_64 = 0xC000003E
AUDIT_ARCH_AARCH64 = 0xC00000B7
X32_SYSCALL_BIT = 0x40000000

SECCOMP_RET_KILL_PROCESS = 0x80000000
SECCOMP_RET_ERRNO = 0x00050000
SECCOMP_RET_ALLOW = 0x7FFF0000

TIOCSTI = 0x5412
TIOCLINUX = 0x541C

# classic BPF opcodes
_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_RET_K = 0x06  # BPF_RET | BPF_K

# offsets in struct seccomp_data {int nr; u32 arch; u64 ip; u64 args[6];}
_OFF_NR = 0
_OFF_ARCH = 4
_OFF_ARG1_LO = 16 + 8 + (0 if sys.byteorder == "little" else 4)

# The syscalls every sandbox is denied, by name.
DENIED = (
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "keyctl",
    "add_key",
    "request_key",
    "mount",
    "umount2",
    "pivot_root",
    "fsopen",
    "fsmount",
    "fsconfig",
    "move_mount",
    "open_tree",
    "fspick",
    "mount_setattr",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
)

# The syscalls every sandbox sees as missing (ENOSYS): see the module docstring, step 4.
# inotify_init has no aarch64 number (only inotify_init1 exists there).
UNAVAILABLE = (
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "inotify_init",
    "inotify_init1",
    "fanotify_init",
    "mq_open",
)

# The syscalls this module names, per architecture (x86_64: arch/x86/entry/syscalls/
# syscall_64.tbl; aarch64: include/uapi/asm-generic/unistd.h).
SYSCALLS: dict[int, dict[str, int]] = {
    AUDIT_ARCH_X86_64: {
        "ioctl": 16,
        "ptrace": 101,
        "mq_open": 240,
        "pivot_root": 155,
        "mount": 165,
        "umount2": 166,
        "init_module": 175,
        "delete_module": 176,
        "kexec_load": 246,
        "add_key": 248,
        "request_key": 249,
        "keyctl": 250,
        "inotify_init": 253,
        "inotify_init1": 294,
        "perf_event_open": 298,
        "fanotify_init": 300,
        "process_vm_readv": 310,
        "process_vm_writev": 311,
        "finit_module": 313,
        "kexec_file_load": 320,
        "bpf": 321,
        "userfaultfd": 323,
        "open_tree": 428,
        "move_mount": 429,
        "fsopen": 430,
        "fsconfig": 431,
        "fsmount": 432,
        "fspick": 433,
        "io_uring_setup": 425,
        "io_uring_enter": 426,
        "io_uring_register": 427,
        "mount_setattr": 442,
    },
    AUDIT_ARCH_AARCH64: {
        "inotify_init1": 26,
        "ioctl": 29,
        "umount2": 39,
        "mount": 40,
        "pivot_root": 41,
        "kexec_load": 104,
        "init_module": 105,
        "delete_module": 106,
        "ptrace": 117,
        "mq_open": 180,
        "add_key": 217,
        "request_key": 218,
        "keyctl": 219,
        "perf_event_open": 241,
        "fanotify_init": 262,
        "process_vm_readv": 270,
        "process_vm_writev": 271,
        "finit_module": 273,
        "bpf": 280,
        "userfaultfd": 282,
        "kexec_file_load": 294,
        "open_tree": 428,
        "move_mount": 429,
        "fsopen": 430,
        "fsconfig": 431,
        "fsmount": 432,
        "fspick": 433,
        "io_uring_setup": 425,
        "io_uring_enter": 426,
        "io_uring_register": 427,
        "mount_setattr": 442,
    },
}

_MACHINES = {"x86_64": AUDIT_ARCH_X86_64, "amd64": AUDIT_ARCH_X86_64}
_MACHINES |= {"aarch64": AUDIT_ARCH_AARCH64, "arm64": AUDIT_ARCH_AARCH64}


class SeccompUnsupported(RuntimeError):
    """This host's architecture has no syscall table here."""


def host_arch() -> int:
    machine = platform.machine().lower()
    if machine not in _MACHINES:
        raise SeccompUnsupported(f"no seccomp syscall table for {machine!r}")
    return _MACHINES[machine]


class _Asm:
    """A tiny classic-BPF assembler with forward labels for conditional jumps."""

    def __init__(self) -> None:
        self.ins: list[tuple[int, str | int, str | int, int]] = []
        self.labels: dict[str, int] = {}

    def label(self, name: str) -> None:
        self.labels[name] = len(self.ins)

    def op(self, code: int, k: int, jt: str | int = 0, jf: str | int = 0) -> None:
        self.ins.append((code, jt, jf, k))

    def assemble(self) -> bytes:
        out = b""
        for i, (code, jt, jf, k) in enumerate(self.ins):
            offs = []
            for j in (jt, jf):
                off = j if isinstance(j, int) else self.labels[j] - i - 1
                if not 0 <= off <= 255:
                    raise ValueError(f"BPF jump out of range at {i}: {off}")
                offs.append(off)
            out += struct.pack("=HBBI", code, offs[0], offs[1], k)
        return out


def build(
    arch: int, denied: tuple[str, ...] = DENIED, unavailable: tuple[str, ...] = UNAVAILABLE
) -> bytes:
    """The filter program for `arch` (an AUDIT_ARCH_* value)."""
    table = SYSCALLS[arch]
    a = _Asm()
    a.op(_LD_W_ABS, _OFF_ARCH)
    a.op(_JEQ_K, arch, 0, "kill")
    a.op(_LD_W_ABS, _OFF_NR)
    if arch == AUDIT_ARCH_X86_64:
        a.op(_JGE_K, X32_SYSCALL_BIT, "enosys", 0)
    for nr in sorted({table[name] for name in denied}):
        a.op(_JEQ_K, nr, "eperm", 0)
    for nr in sorted({table[name] for name in unavailable if name in table}):
        a.op(_JEQ_K, nr, "enosys", 0)
    a.op(_JEQ_K, table["ioctl"], "ioctl", 0)
    a.op(_RET_K, SECCOMP_RET_ALLOW)
    a.label("ioctl")
    a.op(_LD_W_ABS, _OFF_ARG1_LO)
    a.op(_JEQ_K, TIOCSTI, "eperm", 0)
    a.op(_JEQ_K, TIOCLINUX, "eperm", 0)
    a.op(_RET_K, SECCOMP_RET_ALLOW)
    a.label("eperm")
    a.op(_RET_K, SECCOMP_RET_ERRNO | errno.EPERM)
    a.label("enosys")
    a.op(_RET_K, SECCOMP_RET_ERRNO | errno.ENOSYS)
    a.label("kill")
    a.op(_RET_K, SECCOMP_RET_KILL_PROCESS)
    return a.assemble()


def denied(traces_execs: bool = False) -> tuple[str, ...]:
    """`DENIED`, less ptrace in a sandbox whose spec has `traces_execs`."""
    return tuple(n for n in DENIED if not (traces_execs and n == "ptrace"))


@functools.cache
def filter_bytes(traces_execs: bool = False) -> bytes:
    """The host architecture's filter (cached). Raises SeccompUnsupported."""
    return build(host_arch(), denied(traces_execs))


def filter_fd(traces_execs: bool = False) -> int:
    """A pipe read end holding `filter_bytes()` (write end closed), for ``bwrap --seccomp``.

    The caller passes it with ``pass_fds`` and closes it after the spawn."""
    prog = filter_bytes(traces_execs)
    r, w = os.pipe()
    try:
        os.write(w, prog)  # a few hundred bytes: fits the pipe buffer, never blocks
    except BaseException:
        os.close(r)
        raise
    finally:
        os.close(w)
    return r


# ---- the docker backend's profile -------------------------------------------------------------

CLONE_NEW_FLAGS = {
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}
_DOCKER_ARCH = {AUDIT_ARCH_X86_64: "SCMP_ARCH_X86_64", AUDIT_ARCH_AARCH64: "SCMP_ARCH_AARCH64"}


def docker_profile(arch: int | None = None, traces_execs: bool = False) -> dict[str, object]:
    """The same policy as `build`, as a docker seccomp profile (``--security-opt seccomp=``).

    Why our own and not docker's default: the default is an engine setting (an engine run
    with ``--seccomp-profile unconfined``, or older than 25.0, allows io_uring), and a
    container gets one profile only. Docker's default is an allow-list that also stops what
    our deny-list leaves to bwrap's ``--disable-userns``: so this one also refuses new
    namespaces (``unshare``/``clone`` with a ``CLONE_NEW*`` flag, ``setns``: EPERM) and
    ``clone3`` (ENOSYS, whose flags a filter cannot read; glibc falls back to ``clone``).
    Only the host architecture is listed: any other (i386, x32) is refused by the engine."""
    arch = host_arch() if arch is None else arch
    table = SYSCALLS[arch]
    eperm, enosys = errno.EPERM, errno.ENOSYS
    rules: list[dict[str, object]] = [
        {
            "names": [n for n in denied(traces_execs) if n in table],
            "action": "SCMP_ACT_ERRNO",
            "errnoRet": eperm,
        },
        {
            "names": [n for n in UNAVAILABLE if n in table] + ["clone3"],
            "action": "SCMP_ACT_ERRNO",
            "errnoRet": enosys,
        },
        {"names": ["setns"], "action": "SCMP_ACT_ERRNO", "errnoRet": eperm},
    ]
    for flag in CLONE_NEW_FLAGS.values():
        cond = {"index": 0, "value": flag, "valueTwo": flag, "op": "SCMP_CMP_MASKED_EQ"}
        rules.append(
            {
                "names": ["clone", "unshare"],
                "action": "SCMP_ACT_ERRNO",
                "errnoRet": eperm,
                "args": [cond],
            }
        )
    for request in (TIOCSTI, TIOCLINUX):
        cond = {"index": 1, "value": 0xFFFFFFFF, "valueTwo": request, "op": "SCMP_CMP_MASKED_EQ"}
        rules.append(
            {"names": ["ioctl"], "action": "SCMP_ACT_ERRNO", "errnoRet": eperm, "args": [cond]}
        )
    return {
        "defaultAction": "SCMP_ACT_ALLOW",
        "architectures": [_DOCKER_ARCH[arch]],
        "syscalls": rules,
    }
