"""Servers of the tests: `palaestra serve` as a process, one fixture factory for it, and the
readiness waits, whose deadlines grow with the machine's load.

A fixed deadline (the old 60 s) fails a test on a loaded 2-core machine for no fault of the
code: eight cluster tests erred so while ~7 suites ran side by side. `wait_until` scales its
deadline by the run-queue per core (`load_factor`), re-read while it waits, so an idle
machine still fails fast and a loaded one waits as long as the load says it must.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal, TypeVar

import httpx
import pytest

from palaestra.sdk.http import HTTPClient
from palaestra.server.config import REPO_PACKS, Settings

BIN = Path(sys.executable).parent
T = TypeVar("T")
Scope = Literal["function", "module", "session"]


def load_factor() -> float:
    """How much slower than idle this machine runs now: the 1-minute load per core, at
    least 1."""
    try:
        load = os.getloadavg()[0]
    except OSError:  # no load average on this platform
        return 1.0
    return max(1.0, load / (os.cpu_count() or 1))


def scaled(base_s: float) -> float:
    """`base_s` (a deadline on an idle machine) stretched by the load now."""
    return base_s * load_factor()


def wait_until(
    probe: Callable[[], T | None],
    *,
    base_s: float = 60.0,
    interval_s: float = 0.05,
    what: Callable[[], str] | str = "the condition",
) -> T:
    """Call `probe` until it returns something other than None (or False); return that.

    The deadline is `base_s` times the highest load factor seen while waiting. `probe` may
    raise to end the wait at once (a process that exited). On time-out: AssertionError
    naming `what` (a callable is asked then, e.g. for a log's tail)."""
    started = time.monotonic()
    factor = load_factor()
    while True:
        value = probe()
        if value is not None and value is not False:
            return value
        factor = max(factor, load_factor())
        waited = time.monotonic() - started
        if waited > base_s * factor:
            detail = what() if callable(what) else what
            raise AssertionError(
                f"not ready after {waited:.0f} s ({base_s:.0f} s × load factor {factor:.1f}): "
                f"{detail}"
            )
        time.sleep(interval_s)


def answers(url: str, status: int = 200, timeout_s: float = 2.0) -> bool:
    """Whether a GET of `url` answers `status` now (False on any transport error)."""
    try:
        return httpx.get(url, timeout=timeout_s).status_code == status
    except httpx.HTTPError:
        return False


def wait_ready(
    url: str,
    *,
    status: int = 200,
    base_s: float = 60.0,
    alive: Callable[[], None] | None = None,
    what: Callable[[], str] | str = "",
) -> None:
    """Wait until a GET of `url` answers `status`; `alive` raises when the server died."""

    def probe() -> bool:
        if alive is not None:
            alive()
        return answers(url, status, timeout_s=1.0)

    wait_until(probe, base_s=base_s, what=what or f"{url} did not answer {status}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class ServerProcess:
    """`palaestra serve` in a subprocess on loopback; restartable on the same data dir."""

    def __init__(
        self,
        data_dir: Path,
        extra_env: dict[str, str] | None = None,
        args: list[str] | None = None,
        program: Path = BIN / "palaestra",
        prefix: Sequence[str] = (),
    ) -> None:
        self.data_dir = data_dir
        self.program = program  # another install's `palaestra` (tests/install/)
        self.prefix = list(prefix)  # runs it so, e.g. as another user (tests/users.py)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, **(extra_env or {})}
        self.args = args or []
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = data_dir.parent / f"server-{self.port}.log"
        self.token: str | None = None  # the local admin token, read after start

    @property
    def headers(self) -> dict[str, str]:
        """The Authorization header of the local admin token (for raw httpx calls)."""
        return {"authorization": f"Bearer {self.token}"} if self.token else {}

    def client(self, **kwargs: Any) -> HTTPClient:
        """An HTTPClient on this server with its admin token."""
        return HTTPClient(self.url, token=self.token, **kwargs)

    def start(self, ready: int = 200, *, warm: bool = True) -> ServerProcess:
        """Start and wait until /readyz answers `ready` (503: a server that starts unready);
        with `warm`, a 200 must also say `"status": "ready"` (no pack still warming: a cold
        generated-task cache is generated in the background, server/packs/warming.py)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    *self.prefix,
                    str(self.program),
                    "serve",
                    "--port",
                    str(self.port),
                    "--data-dir",
                    str(self.data_dir),
                    *self.args,
                ],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:
            wait_until(lambda: self._ready(ready, warm), what=self.logs)
        except BaseException:  # a server that never got ready is not left running
            self.stop()
            raise
        token_file = self.data_dir / "admin.token"
        if token_file.exists():
            self.token = token_file.read_text().strip()
        return self

    def _ready(self, status: int, warm: bool) -> bool:
        """Whether /readyz answers `status` now (and, with `warm`, no pack is warming)."""
        self._alive()
        try:
            reply = httpx.get(f"{self.url}/readyz", timeout=1)
        except httpx.HTTPError:
            return False
        warming = warm and reply.status_code == 200 and reply.json()["status"] != "ready"
        return reply.status_code == status and not warming

    def _alive(self) -> None:
        assert self.proc is not None and self.proc.poll() is None, self.logs()

    def stop(self, sig: int = signal.SIGINT) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def logs(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def settings_env(overrides: Mapping[str, Any]) -> dict[str, str]:
    """Settings overrides as the `PALAESTRA_<NAME>` variables a server process reads (the
    inverse of server/config.py's coercion); a name Settings lacks is a KeyError."""
    env: dict[str, str] = {}
    for name, value in overrides.items():
        if name not in Settings.model_fields:
            raise KeyError(f"{name!r} is not a setting (server/config.py Settings)")
        if isinstance(value, Mapping):
            text = json.dumps(value)
        elif isinstance(value, list | tuple):
            sep = os.pathsep if name == "packs_dirs" else ","
            text = sep.join(str(v) for v in value)
        elif isinstance(value, bool):
            text = str(value).lower()
        else:
            text = str(value)
        env[f"PALAESTRA_{name.upper()}"] = text
    return env


Packs = Sequence[str] | Mapping[str, Path]


def packs_dir(base: Path, packs: Packs, *, copy: bool = False) -> Path:
    """`base/packs` holding the named packs: repository packs by folder name, or {name:
    path}; linked (copied with `copy`, for a test that writes into a pack)."""
    folder = base / "packs"
    folder.mkdir(parents=True, exist_ok=True)
    named = packs if isinstance(packs, Mapping) else {p: REPO_PACKS / p for p in packs}
    for name, source in named.items():
        if (folder / name).exists():  # a restart on the same folder
            continue
        if copy:
            shutil.copytree(source, folder / name)
        else:
            (folder / name).symlink_to(source)
    return folder


@contextmanager
def serve(
    base: Path,
    *,
    packs: Packs | None = None,
    copy_packs: bool = False,
    settings: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    args: Sequence[str] = (),
    ready: int = 200,
) -> Iterator[ServerProcess]:
    """A started `palaestra serve` on `base/server-data` while the block runs: serving only
    `packs` when given, with `settings` overrides and extra environment `env`."""
    overrides = dict(settings or {})
    if packs is not None:
        overrides["packs_dirs"] = [packs_dir(base, packs, copy=copy_packs)]
    proc = ServerProcess(
        base / "server-data", {**settings_env(overrides), **(env or {})}, list(args)
    )
    try:
        yield proc.start(ready)
    finally:
        proc.stop()


SettingsOf = Mapping[str, Any] | Callable[[pytest.FixtureRequest], Mapping[str, Any]]


def server_fixture(
    scope: Scope = "module",
    *,
    packs: Packs | None = None,
    copy_packs: bool = False,
    settings: SettingsOf | None = None,
    env: Mapping[str, str] | None = None,
    args: Sequence[str] = (),
    skip: Callable[[], str] | None = None,
) -> Any:
    """A pytest fixture of one `serve(...)` per `scope`: the one way a test module gets a
    server process. `settings` may be a function of the request (to read other fixtures);
    `skip` returns why the fixture's tests must skip ("" when they can run)."""

    @pytest.fixture(scope=scope)
    def server_process(
        request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
    ) -> Iterator[ServerProcess]:
        if skip is not None and (why := skip()):
            pytest.skip(why)
        name = request.fixturename or "server"
        if scope == "function":  # a folder of its own: a test may hold two such servers
            base: Path = request.getfixturevalue("tmp_path") / name
        else:
            base = tmp_path_factory.mktemp(name)
        overrides = settings(request) if callable(settings) else settings
        with serve(
            base, packs=packs, copy_packs=copy_packs, settings=overrides, env=env, args=args
        ) as proc:
            yield proc

    return server_process
