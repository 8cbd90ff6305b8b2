"""The fork server's zygote (palaestra.sandbox.forkserver).

Runs inside the bwrap jail as ``python3 -I -S -c <this file> <ctl fd> <seccomp hex>``, so it
imports nothing but the standard library. It never reads task data: it forks on control
messages and closes the descriptors it was handed.
"""

# ruff: noqa: F401
from __future__ import annotations

# Pre-imported for the programs it forks (the hidden-test runner uses these).
import ast
import atexit
import base64
import builtins
import collections
import contextlib
import copy
import ctypes
import errno
import fcntl
import functools
import heapq
import io
import itertools
import json
import math
import os
import random
import re
import resource
import select
import signal
import socket
import string
import struct
import subprocess
import sys
import threading
import time
import traceback
import types
import typing
from typing import Any

libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = (
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_ulong,
    ctypes.c_char_p,
)
libc.prctl.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong)
libc.unshare.argtypes = (ctypes.c_int,)
libc.sethostname.argtypes = (ctypes.c_char_p, ctypes.c_size_t)
libc.capset.argtypes = (ctypes.c_void_p, ctypes.c_void_p)

NEWNS, NEWUTS, NEWIPC = 0x00020000, 0x04000000, 0x08000000
NEWUSER, NEWPID, NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 1, 2, 4, 8, 0x4000, 1 << 18
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_CHILD_SUBREAPER = 1, 24, 36
PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 38, 47, 4
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
UID = GID = 1000
ENCODING = sys.stdout.encoding or "utf-8"


def check(rc: int, what: str) -> None:
    if rc != 0:
        e = ctypes.get_errno()
        raise OSError(e, what + ": " + os.strerror(e))


def put(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def mount(
    src: bytes | None, target: bytes, fstype: bytes | None, flags: int, data: bytes | None = None
) -> None:
    check(libc.mount(src, target, fstype, flags, data), "mount " + target.decode())


def read_exact(fd: int, n: int) -> bytes:
    parts = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise EOFError("the run's data ended early")
        parts.append(chunk)
        n -= len(chunk)
    return b"".join(parts)


def loopback_up() -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        req = struct.pack("16sh22x", b"lo", 0)
        flags = struct.unpack("16sh22x", fcntl.ioctl(s, 0x8913, req))[1]  # SIOCGIFFLAGS
        fcntl.ioctl(s, 0x8914, struct.pack("16sh22x", b"lo", flags | 1))  # SIOCSIFFLAGS, UP
    finally:
        s.close()


def drop_capabilities() -> None:
    for cap in range(64):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            if ctypes.get_errno() == errno.EINVAL:
                break
            check(-1, "PR_CAPBSET_DROP")
    check(libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "ambient caps")
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
    data = (ctypes.c_uint32 * 6)()
    check(libc.capset(header, data), "capset")


def apply_seccomp() -> None:
    """The bwrap backend's seccomp filter (passed hex-encoded as argv[2]), for this process."""
    if len(sys.argv) < 3 or not sys.argv[2]:
        return
    prog = bytes.fromhex(sys.argv[2])

    class FProg(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    buf = ctypes.create_string_buffer(prog, len(prog))
    fprog = FProg(len(prog) // 8, ctypes.cast(buf, ctypes.c_void_p))
    check(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0), "seccomp")


def exit_status(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    with contextlib.suppress(BaseException):
        sys.stderr.write(str(code) + "\n")
    return 1


def run_program(code: str) -> None:
    """What `python3 -I -S -c code` does, in this (forked) interpreter."""
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(  # type: ignore[misc]
        io.BufferedReader(io.FileIO(0, "rb", closefd=False)), encoding=ENCODING
    )
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(  # type: ignore[misc]
        io.BufferedWriter(io.FileIO(1, "wb", closefd=False)), encoding=ENCODING
    )
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(  # type: ignore[misc]
        io.BufferedWriter(io.FileIO(2, "wb", closefd=False)),
        encoding=ENCODING,
        errors="backslashreplace",
        line_buffering=True,
    )
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main
    sys.argv = ["-c"]
    sys.orig_argv = [sys.executable, "-I", "-S", "-c", code]
    try:
        exec(compile(code, "<string>", "exec"), main.__dict__)
        status = 0
    except SystemExit as e:
        status = exit_status(e.code)
    except BaseException:
        status = 1
        with contextlib.suppress(BaseException):
            sys.excepthook(*sys.exc_info())
    try:
        threading._shutdown()  # type: ignore[attr-defined]
        atexit._run_exitfuncs()
    except SystemExit as e:
        status = exit_status(e.code)
    except BaseException:
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            if stream is sys.stdout and status == 0:
                status = 120
    os._exit(status)


def grandchild(
    req: dict[str, Any], data_fd: int, out_fd: int, err_fd: int, status_w: int, lifeline: int
) -> None:
    """pid 1 of the run's pid namespace: finish the jail, unpack the files, run the program."""
    check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "pdeathsig")
    if select.select([lifeline], [], [], 0)[0]:
        os._exit(255)  # the parent died before PDEATHSIG was armed
    os.close(lifeline)
    mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    if req.get("net_ns"):
        loopback_up()
    # No nested user namespaces below this one (needs CAP_SYS_RESOURCE here, which we still
    # hold until drop_capabilities below).
    put("/proc/sys/user/max_user_namespaces", "0")
    (n,) = struct.unpack(">I", read_exact(data_fd, 4))
    header = json.loads(read_exact(data_fd, n))
    code = None
    for name, size in header["files"]:
        data = read_exact(data_fd, size)
        if name is None:
            code = data.decode("utf-8", "surrogateescape")
            continue
        path = "/work/" + name
        parent = os.path.dirname(path)
        if parent != "/work":
            os.makedirs(parent, 0o755, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
    if code is None:
        raise EOFError("the run's data holds no program")
    os.dup2(data_fd, 0)  # what is left of it is the program's stdin
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    mem, ws = req["memory_mb"] << 20, req["workspace_mb"] << 20
    for res, val in (
        (resource.RLIMIT_AS, mem),
        (resource.RLIMIT_FSIZE, ws),
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_NOFILE, 1024),
        (resource.RLIMIT_NPROC, req["nproc"]),
    ):
        resource.setrlimit(res, (val, val))
    drop_capabilities()
    apply_seccomp()
    os.chdir("/work")
    os.write(status_w, b"1")
    os.closerange(3, 1 << 20)
    run_program(code)


def child(req: dict[str, Any], fds: list[int], status_w: int, own_fds: list[int]) -> None:
    """The run's first process: new namespaces and mounts, then pid 1 below it."""
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in own_fds:
            os.close(fd)
        data_fd, out_fd, err_fd = fds[:3]
        if len(fds) == 4:
            # The server moves us into the run's cgroup (it reads our pid from this message's
            # credentials) before we start anything: all the run's processes are inside it.
            os.write(fds[3], b"p")
            if os.read(fds[3], 1) != b"g":
                raise OSError("the server did not put the run in its cgroup")
            os.close(fds[3])
        flags = NEWUSER | NEWNS | NEWPID | NEWIPC | NEWUTS | (NEWNET if req.get("net_ns") else 0)
        check(libc.unshare(flags), "unshare")
        put("/proc/self/setgroups", "deny")
        put("/proc/self/uid_map", f"{UID} {UID} 1")
        put("/proc/self/gid_map", f"{GID} {GID} 1")
        mount(None, b"/", None, MS_REC | MS_PRIVATE)
        mb = int(req["workspace_mb"])
        inodes = max(8192, mb * 256)
        for target, mode in ((b"/work", b"0755"), (b"/tmp", b"1777"), (b"/dev/shm", b"1777")):
            opts = b"size=%dm,nr_inodes=%d,mode=%s" % (mb, inodes, mode)
            mount(b"tmpfs", target, b"tmpfs", MS_NOSUID | MS_NODEV, opts)
        try:
            mount(
                b"devpts",
                b"/dev/pts",
                b"devpts",
                MS_NOSUID | MS_NOEXEC,
                b"newinstance,ptmxmode=0666,mode=0620",
            )
        except OSError:
            mount(b"tmpfs", b"/dev/pts", b"tmpfs", MS_NOSUID | MS_NODEV | MS_RDONLY, b"size=4k")
        check(libc.sethostname(b"sandbox", 7), "sethostname")
        lifeline_r, lifeline_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(lifeline_w)
                grandchild(req, data_fd, out_fd, err_fd, status_w, lifeline_r)
            except BaseException as e:
                try:
                    os.write(status_w, ("E" + repr(e))[:4000].encode())
                finally:
                    os._exit(255)
        for fd in (lifeline_r, data_fd, out_fd, err_fd, status_w):
            os.close(fd)
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        os._exit(code if code >= 0 else 128 - code)
    except BaseException as e:
        try:
            os.write(status_w, ("E" + repr(e))[:4000].encode())
        finally:
            os._exit(255)


def main() -> None:
    ctl = socket.socket(fileno=int(sys.argv[1]))
    check(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "subreaper")
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    signal.set_wakeup_fd(wake_w)
    os.set_blocking(ctl.fileno(), False)
    children: dict[int, list[Any]] = {}  # pid -> [run id, deadline, status fd, timed out]
    by_id: dict[int, int] = {}
    heap: list[tuple[float, int]] = []

    def reply(msg: dict[str, Any]) -> None:
        data = json.dumps(msg).encode()
        while True:
            try:
                ctl.send(data)
                return
            except BlockingIOError:
                select.select([], [ctl], [])

    def kill(pid: int) -> None:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)

    def spawn(req: dict[str, Any], fds: list[int]) -> None:
        if len(fds) != (4 if req.get("cgroup") else 3):
            for fd in fds:
                os.close(fd)
            reply(
                {
                    "id": req.get("id"),
                    "code": 255,
                    "timed_out": False,
                    "setup_error": "expected 3 descriptors (4 with a cgroup)",
                }
            )
            return
        status_r, status_w = os.pipe()
        own = [ctl.fileno(), wake_r, wake_w, status_r] + [c[2] for c in children.values()]
        pid = os.fork()
        if pid == 0:
            child(req, fds, status_w, own)
        os.close(status_w)
        for fd in fds:
            os.close(fd)
        deadline = time.monotonic() + float(req["timeout"])
        children[pid] = [req["id"], deadline, status_r, False]
        by_id[req["id"]] = pid
        heapq.heappush(heap, (deadline, pid))

    def reap() -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            entry = children.pop(pid, None)
            if entry is None:
                continue  # an orphan re-parented to us (we are a subreaper)
            run_id, _, status_r, timed_out = entry
            by_id.pop(run_id, None)
            os.set_blocking(status_r, False)
            try:
                note = os.read(status_r, 8192)
            except OSError:
                note = b""
            os.close(status_r)
            code = os.waitstatus_to_exitcode(status)
            msg = {
                "id": run_id,
                "code": code if code >= 0 else 128 - code,
                "timed_out": timed_out,
                "setup_error": None,
            }
            if not note.startswith(b"1") and not timed_out:
                msg["setup_error"] = note[1:].decode("utf-8", "replace") or (
                    f"the run died before its program started (exit {code})"
                )
            reply(msg)

    reply({"ready": True, "pid": os.getpid()})
    while True:
        now = time.monotonic()
        while heap and (heap[0][1] not in children or heap[0][0] <= now):
            deadline, pid = heapq.heappop(heap)
            entry = children.get(pid)
            if entry is not None and entry[1] == deadline and not entry[3]:
                entry[3] = True
                kill(pid)
        timeout = max(0.0, heap[0][0] - now) if heap else None
        watched: list[Any] = [ctl, wake_r]
        ready = select.select(watched, [], [], timeout)[0]
        if wake_r in ready:
            try:
                while os.read(wake_r, 4096):
                    pass
            except BlockingIOError:
                pass
        if ctl in ready:
            while True:
                try:
                    msg, fds, _, _ = socket.recv_fds(ctl, 65536, 8)
                except BlockingIOError:
                    break
                if not msg:
                    for pid in list(children):
                        kill(pid)
                    os._exit(0)
                req = json.loads(msg)
                if "kill" in req:
                    for fd in fds:
                        os.close(fd)
                    victim = by_id.get(req["kill"])
                    if victim is not None and not children[victim][3]:
                        children[victim][3] = True
                        kill(victim)
                    continue
                spawn(req, fds)
        reap()


if __name__ == "__main__":
    main()
