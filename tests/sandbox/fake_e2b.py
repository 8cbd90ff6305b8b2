"""FakeE2B: a FAKE of the `e2b` SDK's async API, at the SDK boundary, for tests only.

The E2B cloud cannot be reached from CI, so `E2BBackend` is tested against this fake.
It mimics the SDK's object model -- ``FakeE2B().create(**kw)`` stands for
``e2b.AsyncSandbox.create(**kw)`` and returns a `FakeAsyncSandbox` with ``.sandbox_id``,
``.commands.run(...)`` (foreground, or ``background=True`` -> a handle with ``.pid``,
``.wait()``, ``.kill()``, ``.disconnect()``), ``.files.read/.write``, ``.kill()`` and
``.is_running()`` -- and raises the SDK's own exception classes (`CommandExitException`
on a non-zero exit, `FileNotFoundException`, `InvalidArgumentException`,
`SandboxNotRunningException` once killed, `TimeoutException` past ``timeout``).

Behaviour is real, not scripted: each fake "VM" is one long-lived bwrap (pid, mount, ipc,
uts and -- unless ``allow_internet_access`` -- network namespaces) whose root is a
writable host folder with the host's /usr read-only, a ``user`` (uid 1000, home
/home/user) and root (uid 0).  Every command and file operation enters those namespaces
with ``nsenter`` and runs there as that user, so, as in E2B's VMs:

* processes outlive the command that started them (a background ``sleep &`` keeps
  running), and ``run(..., timeout=...)`` raises `TimeoutException` but leaves the
  command running -- the behaviour the backend must clean up after;
* the filesystem persists between commands (/tmp too) and permissions apply;
* commands run as ``/bin/bash -l -c CMD`` with envd-like variables (HOME, USER, PATH),
  never this host's environment.

Not modelled: templates other than ``base``, pty, stdin streaming, watch, git, metadata
queries, sandbox lifetime timeouts, and the API's latency.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import inspect
import json
import os
import secrets
import shutil
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from e2b.exceptions import (
    FileNotFoundException,
    InvalidArgumentException,
    SandboxException,
    SandboxNotRunningException,
    TimeoutException,
)
from e2b.sandbox.commands.command_handle import CommandExitException, CommandResult

USER_UID = 1000
ENVD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
OutputHandler = Callable[[str], "Awaitable[None] | None"]


def _usr_args() -> list[str]:
    out = ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "lib", "lib32", "lib64", "sbin"):
        host = f"/{name}"
        if os.path.islink(host):
            out += ["--symlink", os.readlink(host), host]
        elif os.path.isdir(host):
            out += ["--ro-bind", host, host]
    for p in ("/etc/ld.so.cache", "/etc/alternatives", "/etc/ssl/certs"):
        if os.path.exists(p):
            out += ["--ro-bind", p, p]
    return out


class FakeE2B:
    """The fake SDK entry point: pass ``FakeE2B(root).create`` as the `sandbox_factory`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.created: list[FakeAsyncSandbox] = []
        self.create_kwargs: list[dict[str, Any]] = []
        self.fail_next_create: BaseException | None = None

    async def create(
        self,
        template: str | None = None,
        timeout: int | None = None,
        metadata: dict[str, str] | None = None,
        envs: dict[str, str] | None = None,
        allow_internet_access: bool | None = None,
        **opts: Any,
    ) -> FakeAsyncSandbox:
        self.create_kwargs.append(
            {"template": template, "timeout": timeout, "metadata": metadata, "envs": envs}
            | {"allow_internet_access": allow_internet_access, **opts}
        )
        if self.fail_next_create is not None:
            exc, self.fail_next_create = self.fail_next_create, None
            raise exc
        if template not in (None, "base"):
            raise SandboxException(f"404: template '{template}' not found", status_code=404)
        box = FakeAsyncSandbox(
            self.root / secrets.token_hex(6),
            envs=envs or {},
            internet=True if allow_internet_access is None else allow_internet_access,
        )
        await box._start()
        self.created.append(box)
        return box

    @property
    def running(self) -> list[FakeAsyncSandbox]:
        return [b for b in self.created if b._running]


class FakeAsyncSandbox:
    def __init__(self, vm: Path, *, envs: dict[str, str], internet: bool) -> None:
        self.sandbox_id = f"fake-{vm.name}"
        self._vm = vm
        self._envs = envs
        self._internet = internet
        self._proc: asyncio.subprocess.Process | None = None
        self._init_pid = 0
        self._sleep_pid = 0
        self._running = False
        self.commands = FakeCommands(self)
        self.files = FakeFilesystem(self)

    async def _start(self) -> None:
        vm = self._vm
        for d in ("tmp", "home/user", "etc", "root"):
            (vm / d).mkdir(parents=True, exist_ok=True)
        os.chmod(vm, 0o755)
        os.chmod(vm / "tmp", 0o1777)
        os.chown(vm / "home/user", USER_UID, USER_UID)
        (vm / "etc/passwd").write_text(
            "root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000::/home/user:/bin/bash\n"
        )
        (vm / "etc/group").write_text("root:x:0:\nuser:x:1000:\n")
        (vm / "etc/hosts").write_text("127.0.0.1\tlocalhost\n")
        info_r, info_w = os.pipe()
        args = ["bwrap", "--bind", str(vm), "/", *_usr_args(), "--proc", "/proc", "--dev", "/dev"]
        args += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--hostname", "e2b"]
        if not self._internet:
            args += ["--unshare-net"]
        args += ["--die-with-parent", "--info-fd", str(info_w), "--", "/usr/bin/sleep", "inf"]
        self._proc = await asyncio.create_subprocess_exec(
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            pass_fds=(info_w,),
            start_new_session=True,
            env={"PATH": "/usr/bin:/bin"},
        )
        os.close(info_w)
        try:
            raw = await asyncio.to_thread(_read_all, info_r)
        finally:
            os.close(info_r)
        if not raw:
            assert self._proc.stderr is not None
            err = await self._proc.stderr.read()
            raise SandboxException(f"fake VM failed to start: {err.decode(errors='replace')}")
        self._init_pid = int(json.loads(raw)["child-pid"])
        # bwrap reports the pid before its mounts are done; `sleep` running means they are.
        deadline = time.monotonic() + 10
        while not (kids := _descendants(self._init_pid)):
            if time.monotonic() > deadline:
                raise SandboxException("fake VM did not come up in 10 s")
            await asyncio.sleep(0.002)
        self._sleep_pid = kids[0]
        self._running = True

    def _check(self) -> None:
        if not self._running:
            raise SandboxNotRunningException(
                f"The sandbox {self.sandbox_id} was not found: it was killed or reached its timeout"
            )

    def _enter(self, user: str | None, env: dict[str, str], argv: list[str]) -> list[str]:
        uid = 0 if user == "root" else USER_UID
        home = "/root" if uid == 0 else "/home/user"
        base = {"PATH": ENVD_PATH, "HOME": home, "USER": user or "user", **self._envs, **env}
        ns = ["-m", "-p", "-i", "-u", "-n"]
        return [
            "nsenter", "-t", str(self._init_pid), *ns, "-S", str(uid), "-G", str(uid), "-w",
            "--", "/usr/bin/env", "-i", *(f"{k}={v}" for k, v in base.items()), *argv,
        ]  # fmt: skip

    async def _spawn(
        self, user: str | None, env: dict[str, str], argv: list[str], stdin: bool = False
    ) -> asyncio.subprocess.Process:
        self._check()
        return await asyncio.create_subprocess_exec(
            *self._enter(user, env, argv),
            stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={"PATH": "/usr/bin:/bin"},
        )

    async def kill(self, **opts: Any) -> bool:
        if not self._running:
            return False
        self._running = False
        with contextlib.suppress(ProcessLookupError):
            os.kill(self._init_pid, signal.SIGKILL)
        if self._proc is not None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()
            await self._proc.wait()
        await asyncio.to_thread(shutil.rmtree, self._vm, True)
        return True

    async def is_running(self, request_timeout: float | None = None) -> bool:
        return self._running

    def processes(self) -> list[int]:
        """Host pids of the live processes in the fake VM besides its init and `sleep` (a
        probe). A killed process the VM's init has not reaped yet (a zombie, for a moment
        on a loaded machine) is not live: it runs nothing."""
        try:
            ns = os.readlink(f"/proc/{self._init_pid}/ns/pid")
        except OSError:
            return []
        keep = {self._init_pid, self._sleep_pid}
        out = []
        for d in Path("/proc").iterdir():
            if d.name.isdigit() and int(d.name) not in keep:
                with contextlib.suppress(OSError):
                    if os.readlink(d / "ns/pid") == ns and not _dead(d):
                        out.append(int(d.name))
        return out


def _dead(proc: Path) -> bool:
    """Whether /proc/<pid> is a zombie (killed, not yet reaped) or gone."""
    state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
    return state in ("Z", "X")


def _read_all(fd: int) -> bytes:
    out = b""
    while chunk := os.read(fd, 65536):
        out += chunk
    return out


def _descendants(pid: int) -> list[int]:
    out: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            kids = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            continue
        for k in kids:
            out.append(int(k))
            todo.append(int(k))
    return out


class FakeCommandHandle:
    """Like ``e2b.AsyncCommandHandle``: output streams to the callbacks while it runs."""

    def __init__(
        self,
        proc: asyncio.subprocess.Process,
        on_stdout: OutputHandler | None,
        on_stderr: OutputHandler | None,
        retain_output: bool,
        timeout: float | None,
    ) -> None:
        self._proc = proc
        self._out: list[str] = []
        self._err: list[str] = []
        self._retain = retain_output
        self._timeout = timeout
        self._task = asyncio.ensure_future(self._pump(on_stdout, on_stderr))

    @property
    def pid(self) -> int:
        kids = _descendants(self._proc.pid)
        return kids[0] if kids else self._proc.pid

    async def _pump(self, on_out: OutputHandler | None, on_err: OutputHandler | None) -> int:
        async def read(stream: asyncio.StreamReader, keep: list[str], cb: OutputHandler | None):
            dec = codecs.getincrementaldecoder("utf-8")("replace")
            while chunk := await stream.read(4096):
                text = dec.decode(chunk)
                if not text:
                    continue
                if self._retain:
                    keep.append(text)
                if cb is not None:
                    r = cb(text)
                    if inspect.isawaitable(r):
                        await r

        assert self._proc.stdout is not None and self._proc.stderr is not None
        await asyncio.gather(
            read(self._proc.stdout, self._out, on_out), read(self._proc.stderr, self._err, on_err)
        )
        return await self._proc.wait()

    async def wait(self) -> CommandResult[Any]:
        try:
            if self._timeout:
                rc = await asyncio.wait_for(asyncio.shield(self._task), self._timeout)
            else:
                rc = await asyncio.shield(self._task)
        except TimeoutError:
            # As in E2B: the connection times out, the command itself keeps running.
            raise TimeoutException("context deadline exceeded: the command timed out") from None
        out = "".join(self._out) if self._retain else None
        err = "".join(self._err) if self._retain else None
        error = None
        if rc < 0:  # nsenter forwards a signal death as its own
            error, rc = f"signal: {signal.Signals(-rc).name.lower()}", -1
        elif rc > 128 and rc - 128 in (9, 15):
            error = f"signal: {signal.Signals(rc - 128).name.lower()}"
        if rc != 0:
            raise CommandExitException(stderr=err, stdout=out, exit_code=rc, error=error)
        return CommandResult(stderr=err, stdout=out, exit_code=0, error=None)

    async def kill(self) -> bool:
        """SIGKILL the command's process (not its children, as envd)."""
        kids = _descendants(self._proc.pid)
        if not kids:
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(kids[0], signal.SIGKILL)
        return True

    async def disconnect(self) -> None:
        self._task.cancel()


class FakeCommands:
    def __init__(self, box: FakeAsyncSandbox) -> None:
        self._box = box

    async def run(
        self,
        cmd: str,
        background: bool | None = None,
        envs: dict[str, str] | None = None,
        user: str | None = None,
        cwd: str | None = None,
        on_stdout: OutputHandler | None = None,
        on_stderr: OutputHandler | None = None,
        stdin: bool | None = None,
        timeout: float | None = 60,
        request_timeout: float | None = None,
        *,
        retain_output: bool = True,
    ) -> Any:
        home = "/root" if user == "root" else "/home/user"
        argv = ["/bin/sh", "-c", 'cd -- "$1" && exec /bin/bash -l -c "$2"', "sh", cwd or home, cmd]
        proc = await self._box._spawn(user, envs or {}, argv)
        handle = FakeCommandHandle(proc, on_stdout, on_stderr, retain_output, timeout)
        return handle if background else await handle.wait()


class FakeFilesystem:
    """Files move through ``cat`` run inside the VM as the user: permissions apply."""

    def __init__(self, box: FakeAsyncSandbox) -> None:
        self._box = box

    def _path(self, path: str, user: str | None) -> str:
        return (
            path
            if path.startswith("/")
            else f"{'/root' if user == 'root' else '/home/user'}/{path}"
        )

    async def read(
        self, path: str, format: str = "text", user: str | None = None, **kw: Any
    ) -> Any:
        p = self._path(path, user)
        proc = await self._box._spawn(user, {}, ["/bin/cat", "--", p])
        out, err = await proc.communicate()
        if proc.returncode != 0:
            msg = err.decode(errors="replace")
            if "No such file" in msg:
                raise FileNotFoundException(f"file '{p}' not found")
            if "Is a directory" in msg:
                raise InvalidArgumentException(f"path '{p}' is a directory")
            raise SandboxException(f"read {p}: {msg}")
        if format == "bytes":
            return bytearray(out)
        return out.decode()

    async def write(self, path: str, data: str | bytes, user: str | None = None, **kw: Any) -> Any:
        p = self._path(path, user)
        raw = data.encode() if isinstance(data, str) else data
        script = 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"'
        proc = await self._box._spawn(user, {}, ["/bin/sh", "-c", script, "sh", p], stdin=True)
        _, err = await proc.communicate(raw)
        if proc.returncode != 0:
            msg = err.decode(errors="replace")
            if "Is a directory" in msg or "Not a directory" in msg:
                raise InvalidArgumentException(f"write {p}: {msg}")
            raise SandboxException(f"write {p}: {msg}")
        return {"path": p, "name": os.path.basename(p), "type": "file"}
