"""The `e2b` backend (DESIGN §5): one E2B cloud micro-VM per sandbox, through the `e2b` SDK.

The SDK's async API is used (``AsyncSandbox.create``, ``.commands.run``, ``.files.read`` /
``.write``, ``.kill``); the entry point is injectable (``sandbox_factory``), so tests run
the backend against ``FakeE2B`` (tests/sandbox/fake_e2b.py), a fake at the SDK boundary.

The VM is the isolation boundary: the sandbox sees nothing of this host.  Each sandbox
gets ``spec.workdir`` (created as root, owned by the SDK's default user), and every
`exec` runs as that user through a small ``sh`` wrapper that

* changes to the cwd (a missing cwd is data: exit 1, like a failed ``cd``);
* clears the environment (``env -i``) and sets the same base variables as bwrap, the
  spec's and the caller's, plus ``PALAESTRA_EXEC=<token>``, a marker inherited by
  every process the command starts;
* sets ``RLIMIT_AS`` = memory_mb, no core files, 1024 open files;
* once the command is done, SIGKILLs every process that still carries the marker (the
  VM outlives a command, unlike bwrap's pid namespace; E2B itself leaves background
  processes running), so no code of one exec runs after it.  A process that clears its
  own environment escapes this sweep; that is best effort, inside a VM of its own.

Timeouts are ours, not the SDK's: past ``timeout`` the marker sweep runs from a second
command, the first is killed, and the result is ``timed_out=True, exit_code=-9``.
Output is capped as it streams in (``max_output`` bytes each of stdout and stderr).
``upload_tar``/``download_tar`` move one tar file through the files API and run ``tar``
in the VM; members are checked here first, with bwrap's rules. The files API moves a file
whole, so ``download_tar_to``/``upload_tar_from`` hold the tar in memory once; the VM
measures a download before it is read, and one over ``workspace_mb + 16`` MiB (or the
caller's lower limit) is `SandboxFileTooLarge`.

Not enforced per sandbox: cpus, pids, workspace_mb and the VM's memory (E2B sets those
per template); ``spec.image`` names an E2B template (default ``base``).  SDK errors map
to `SandboxCreateError` (create), `SandboxGone` (the VM is not running any more),
`FileNotFoundError` and `SandboxPathError` (files), `SandboxError` (anything else).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import posixpath
import secrets
import shlex
import tarfile
import time
from collections.abc import Awaitable, Callable
from typing import Any, BinaryIO

from palaestra.sandbox.base import (
    DEFAULT_MAX_OUTPUT,
    Backend,
    ExecResult,
    Sandbox,
    SandboxCreateError,
    SandboxError,
    SandboxGone,
    SandboxPathError,
    SandboxSpec,
    SandboxSpecError,
    check_gateway,
    close_all,
    read_limit,
    too_large,
    transfer_limit,
    upload_member,
)
from palaestra.sandbox.egress import check_network
from palaestra.sandbox.preamble import (
    TIMEOUT_EXIT_CODE,
    append_capped,
    memory_error,
    prepare_exec,
    rlimits,
)

log = logging.getLogger(__name__)

DEFAULT_TEMPLATE = "base"
DEFAULT_USER = "user"
KILL_GRACE_S = 0.9
MISSING_EXIT = 44  # our wrapper's "no such path" for download_tar
TOO_LARGE_EXIT = 45  # ... and "the tar is over the limit"
MARKER = "PALAESTRA_EXEC"

SandboxFactory = Callable[..., Awaitable[Any]]


def _default_factory() -> SandboxFactory:
    try:
        from e2b import AsyncSandbox
    except ImportError as e:  # pragma: no cover - depends on the install
        raise SandboxCreateError("the e2b backend needs the `e2b` package: pip install e2b") from e
    create: SandboxFactory = AsyncSandbox.create
    return create


def _classify(exc: BaseException) -> str:
    """'gone', 'missing', 'invalid', 'exit', 'timeout' or 'other' for an SDK exception.

    By class name along the MRO, so the mapping needs no import of the SDK (it is optional)."""
    names = {c.__name__ for c in type(exc).__mro__}
    if names & {"SandboxNotRunningException", "SandboxNotFoundException"}:
        return "gone"
    if "CommandExitException" in names:
        return "exit"
    if names & {"FileNotFoundException", "NotFoundException"}:
        return "missing"
    if "InvalidArgumentException" in names:
        return "invalid"
    if "TimeoutException" in names:
        return "timeout"
    return "other"


def check_tar_members(data: bytes) -> None:
    """Refuse a tar whose members escape their destination (bwrap's rules), before upload."""
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tf:
            for m in tf:
                upload_member(m)
    except tarfile.TarError as e:
        raise SandboxError(f"not a tar archive: {e}") from e


def _strip_dot(data: bytes) -> bytes:
    """Re-pack a tar made with ``tar -C dir .`` so names read ``a/b``, as bwrap's do."""
    out = io.BytesIO()
    with (
        tarfile.open(fileobj=io.BytesIO(data), mode="r:") as src,
        tarfile.open(fileobj=out, mode="w") as dst,
    ):
        for m in src:
            name = m.name[2:] if m.name.startswith("./") else m.name
            if name in ("", "."):
                continue
            m.name = name.rstrip("/")
            dst.addfile(m, src.extractfile(m) if m.isreg() else None)
    return out.getvalue()


class E2BBackend(Backend):
    """Creates `E2BSandbox`es; `sandbox_factory` defaults to ``e2b.AsyncSandbox.create``."""

    name = "e2b"

    def __init__(
        self,
        *,
        api_key: str | None = None,
        template: str = DEFAULT_TEMPLATE,
        sandbox_timeout_s: int = 3600,
        user: str = DEFAULT_USER,
        sandbox_factory: SandboxFactory | None = None,
    ) -> None:
        self.api_key = api_key
        self.template = template
        self.sandbox_timeout_s = sandbox_timeout_s
        self.user = user
        self._factory = sandbox_factory
        self._live: set[E2BSandbox] = set()

    @property
    def live_count(self) -> int:
        return len(self._live)

    async def create(self, spec: SandboxSpec) -> E2BSandbox:
        if not posixpath.isabs(spec.workdir) or posixpath.normpath(spec.workdir) == "/":
            raise SandboxCreateError(f"workdir must be an absolute path below /: {spec.workdir!r}")
        check_network(spec, None, self.name)  # no way to put the server's proxy in a cloud VM
        check_gateway(spec, None, self.name)  # nor the model gateway's listener
        if spec.ro_binds:
            # A cloud sandbox cannot see this host's directories: say so rather than run
            # without the toolchain the family asked for.
            raise SandboxSpecError(
                "ro_binds (host directories) cannot be bound into an e2b sandbox"
            )
        factory = self._factory or _default_factory()
        kwargs: dict[str, Any] = {
            "template": spec.image or self.template,
            "timeout": self.sandbox_timeout_s,
            "allow_internet_access": False,
            "metadata": {"owner": "palaestra"},
        }
        if self.api_key:
            kwargs["api_key"] = self.api_key
        try:
            remote = await factory(**kwargs)
        except Exception as e:
            raise SandboxCreateError(f"e2b could not create a sandbox: {e}") from e
        box = E2BSandbox(spec, remote, user=self.user, on_close=self._live.discard)
        try:
            await box._setup()
        except BaseException as e:
            await asyncio.shield(box.close())
            if isinstance(e, SandboxError) and not isinstance(e, SandboxCreateError):
                raise SandboxCreateError(f"e2b sandbox setup failed: {e}") from e
            raise
        self._live.add(box)
        return box

    async def aclose(self) -> None:
        await close_all(self._live)


class E2BSandbox(Sandbox):
    def __init__(
        self,
        spec: SandboxSpec,
        remote: Any,
        *,
        user: str = DEFAULT_USER,
        on_close: Callable[[E2BSandbox], None] | None = None,
    ) -> None:
        self.spec = spec
        self.remote = remote
        self.id = str(getattr(remote, "sandbox_id", "") or secrets.token_hex(8))
        self.user = user
        self._workdir = posixpath.normpath(spec.workdir)
        self._on_close = on_close
        self._closed = False
        self._dead = False

    # ---- lifecycle -------------------------------------------------------------------------

    async def _setup(self) -> None:
        w = shlex.quote(self._workdir)
        u = shlex.quote(f"{self.user}:{self.user}")
        await self._run_raw(f"mkdir -p -- {w} && chown {u} -- {w}", user="root", what="setup")

    @property
    def alive(self) -> bool:
        return not (self._closed or self._dead)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self.remote.kill()
        except Exception:  # already gone, or the API is unreachable: nothing more to do here
            log.warning("killing e2b sandbox %s failed", self.id, exc_info=True)
        if self._on_close is not None:
            self._on_close(self)

    def _check_alive(self) -> None:
        if self._closed:
            raise SandboxGone(f"sandbox {self.id} is closed")
        if self._dead:
            raise SandboxGone(f"sandbox {self.id} is not running any more")

    def _map(self, exc: BaseException, what: str) -> BaseException:
        kind = _classify(exc)
        if kind == "gone":
            self._dead = True
            return SandboxGone(f"sandbox {self.id} is not running any more ({what}): {exc}")
        return SandboxError(f"e2b {what} failed: {exc}")

    async def _run_raw(self, script: str, *, user: str | None = None, what: str = "exec") -> str:
        """Run an internal command to completion; a non-zero exit is a SandboxError."""
        try:
            res = await self.remote.commands.run(script, user=user or self.user, timeout=120)
        except Exception as e:
            if _classify(e) == "exit":
                code = getattr(e, "exit_code", "?")
                raise SandboxError(
                    f"e2b {what} exited {code}: {getattr(e, 'stderr', '') or ''}"[:2000]
                ) from e
            raise self._map(e, what) from e
        return str(res.stdout or "")

    # ---- exec ------------------------------------------------------------------------------

    def _abs(self, path: str) -> str:
        """An absolute in-sandbox path under the workdir; SandboxPathError if it escapes."""
        if "\0" in path:
            raise SandboxPathError(f"NUL in path {path!r}")
        norm = posixpath.normpath(posixpath.join(self._workdir, path))
        if norm != self._workdir and not norm.startswith(self._workdir + "/"):
            raise SandboxPathError(f"path {path!r} is outside the workspace {self._workdir}")
        return norm

    def _sweep(self, token: str) -> str:
        """Shell that SIGKILLs every process carrying this exec's marker (a few passes)."""
        pat = shlex.quote(f"{MARKER}={token}")
        return (
            "for _i in 1 2 3; do _l=$(grep -lzxs -- " + pat + " /proc/[0-9]*/environ); "
            '[ -z "$_l" ] && break; for _f in $_l; do _p=${_f#/proc/}; '
            'kill -9 "${_p%/environ}" 2>/dev/null; done; done'
        )

    async def exec(
        self,
        cmd: list[str] | str,
        *,
        timeout: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        stdin: bytes | str | None = None,
        max_output: int = DEFAULT_MAX_OUTPUT,
    ) -> ExecResult:
        self._check_alive()
        x = prepare_exec(
            self.spec, self._workdir, cmd, timeout=timeout, cwd=cwd, env=env, stdin=stdin
        )
        argv, timeout, run_dir, data = x.argv, x.timeout, x.cwd, x.stdin
        token = secrets.token_hex(12)
        full_env = {**x.env, MARKER: token}
        q = shlex.quote
        stdin_path = "/dev/null"
        start = time.monotonic()
        if data:
            stdin_path = f"/tmp/.palaestra-stdin-{token}"
            await self._write_raw(stdin_path, data)
        envs = " ".join(q(f"{k}={v}") for k, v in full_env.items())
        limits = rlimits(self.spec, memory_cgroup=False)
        script = (
            f"cd -- {q(run_dir)} 2>/dev/null || "
            f"{{ echo {q(f'palaestra: cannot chdir to {run_dir}')} >&2; exit 1; }}\n"
            f"(ulimit -v {limits['as'] // 1024}; ulimit -c {limits['core']}; "
            f"ulimit -n {limits['nofile']}; "
            f"exec /usr/bin/env -i {envs} {' '.join(q(a) for a in argv)}) <{q(stdin_path)}\n"
            "_rc=$?\n"
            + (f"rm -f -- {q(stdin_path)}\n" if data else "")
            + self._sweep(token)
            + "\nexit $_rc\n"
        )
        out, err = bytearray(), bytearray()
        truncated = False

        def sink(buf: bytearray) -> Callable[[str], None]:
            def on(chunk: str) -> None:
                nonlocal truncated
                raw = chunk.encode("utf-8", errors="surrogateescape")
                if append_capped(buf, raw, max_output):
                    truncated = True

            return on

        try:
            handle = await self.remote.commands.run(
                script,
                background=True,
                user=self.user,
                on_stdout=sink(out),
                on_stderr=sink(err),
                timeout=timeout + 60,
            )
        except Exception as e:
            raise self._map(e, "exec") from e
        waiter = asyncio.ensure_future(handle.wait())
        timed_out = False
        code: int | None = None
        try:
            done, _ = await asyncio.wait({waiter}, timeout=timeout)
            if not done:
                timed_out = True
                await self._kill_marked(token, handle)
                await asyncio.wait({waiter}, timeout=KILL_GRACE_S)
            if waiter.done():
                exc = waiter.exception()
                if exc is None:
                    code = int(waiter.result().exit_code)
                elif _classify(exc) == "exit":
                    code = int(getattr(exc, "exit_code", 1))
                elif not timed_out:
                    raise self._map(exc, "exec") from exc
        finally:
            if not waiter.done():
                waiter.cancel()
                with contextlib.suppress(BaseException):
                    await handle.disconnect()
        duration = time.monotonic() - start
        stdout = out.decode("utf-8", errors="replace")
        stderr = err.decode("utf-8", errors="replace")
        if timed_out:
            return ExecResult(TIMEOUT_EXIT_CODE, stdout, stderr, True, False, truncated, duration)
        assert code is not None
        if code < 0:  # envd's report of a signal death of the wrapper itself
            code = 128 + 9
        oom = code == 128 + 9 or memory_error(stderr)
        return ExecResult(code, stdout, stderr, False, oom, truncated, duration)

    async def _kill_marked(self, token: str, handle: Any) -> None:
        """After a timeout: SIGKILL every process of this exec, then the wrapper itself."""
        try:
            await self.remote.commands.run(self._sweep(token), user=self.user, timeout=30)
        except Exception as e:
            if _classify(e) not in ("exit",):
                log.warning("e2b sweep after a timeout failed in %s: %s", self.id, e)
        with contextlib.suppress(Exception):
            await handle.kill()

    # ---- files -----------------------------------------------------------------------------

    async def _write_raw(self, path: str, data: bytes) -> None:
        try:
            await self.remote.files.write(path, data, user=self.user)
        except Exception as e:
            kind = _classify(e)
            if kind in ("invalid", "missing"):
                raise SandboxPathError(f"cannot write {path!r}: {e}") from e
            raise self._map(e, "write") from e

    async def read_file(self, path: str) -> bytes:
        self._check_alive()
        full = self._abs(path)
        if full == self._workdir:
            raise SandboxPathError(f"{path!r} is a directory")
        try:
            data = await self.remote.files.read(full, format="bytes", user=self.user)
        except Exception as e:
            kind = _classify(e)
            if kind == "missing":
                raise FileNotFoundError(f"no such file in the sandbox: {path!r}") from e
            if kind == "invalid":
                raise SandboxPathError(f"{path!r} is not a regular file: {e}") from e
            raise self._map(e, "read") from e
        return bytes(data)

    async def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        self._check_alive()
        full = self._abs(path)
        if full == self._workdir:
            raise SandboxPathError("cannot write to the workdir itself")
        raw = data.encode() if isinstance(data, str) else data
        await self._write_raw(full, raw)
        if mode & 0o777 != 0o644:
            await self._run_raw(f"chmod {mode & 0o777:o} -- {shlex.quote(full)}", what="chmod")

    async def upload_tar(self, data: bytes, dest: str | None = None) -> None:
        self._check_alive()
        target = self._abs(dest or ".")
        check_tar_members(data)
        tmp = f"/tmp/.palaestra-up-{secrets.token_hex(8)}.tar"
        await self._write_raw(tmp, data)
        q = shlex.quote
        await self._run_raw(
            f"mkdir -p -- {q(target)} && tar --no-same-owner -xf {q(tmp)} -C {q(target)};"
            f" _rc=$?; rm -f -- {q(tmp)}; exit $_rc",
            what="upload_tar",
        )

    async def download_tar(self, path: str | None = None) -> bytes:
        self._check_alive()
        return await self._download(path, read_limit(self.spec))

    async def download_tar_to(
        self, out: BinaryIO, path: str | None = None, *, limit: int | None = None
    ) -> int:
        """`download_tar` into `out`: the files API gives the tar whole, so it is held once,
        but never past `transfer_limit` (the VM measures it before it is read)."""
        self._check_alive()
        data = await self._download(path, transfer_limit(self.spec, limit))
        await asyncio.to_thread(out.write, data)
        return len(data)

    async def _download(self, path: str | None, limit: int) -> bytes:
        """The tar of `path`, made in the VM and read only when it is at most `limit` bytes
        (SandboxFileTooLarge naming the limit: E2B sets no workspace size, so the cap is
        what bounds what the server takes in)."""
        full = self._abs(path or ".")
        tmp = f"/tmp/.palaestra-down-{secrets.token_hex(8)}.tar"
        q = shlex.quote
        if full == self._workdir:
            what = f"-C {q(full)} ."
        else:
            what = f"-C {q(posixpath.dirname(full))} -- {q(posixpath.basename(full))}"
        try:
            await self._run_raw(
                f"[ -e {q(full)} ] || [ -L {q(full)} ] || exit {MISSING_EXIT}; "
                f"tar -cf {q(tmp)} {what} || exit $?; "
                f'[ "$(stat -c %s {q(tmp)})" -le {limit} ] || {{ rm -f -- {q(tmp)}; '
                f"exit {TOO_LARGE_EXIT}; }}",
                what="download_tar",
            )
        except SandboxError as e:
            if f"exited {MISSING_EXIT}" in str(e):
                raise FileNotFoundError(f"no such path in the sandbox: {path!r}") from e
            if f"exited {TOO_LARGE_EXIT}" in str(e):
                raise too_large(limit, f"the tar of {path or self._workdir!r}") from e
            raise
        try:
            raw = await self.remote.files.read(tmp, format="bytes", user=self.user)
        except Exception as e:
            raise self._map(e, "download_tar") from e
        finally:
            with contextlib.suppress(Exception):
                await self.remote.commands.run(f"rm -f -- {q(tmp)}", user=self.user, timeout=30)
        return _strip_dot(bytes(raw))
