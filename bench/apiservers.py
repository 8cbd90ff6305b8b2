"""bench/api.py's two servers and its raw HTTP/1.1 client: palaestra's `serve` and OpenEnv's
echo_env (from its own CLI, in its own venv), each a subprocess on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from palaestra.server.config import load_settings_with_sources

ROOT = Path(__file__).resolve().parent.parent
OPENENV_VERSION = "0.10.0"
ECHO_TASK = "palaestra/echo:say-birch"
OPENENV_WS_SESSIONS = 256  # the most WebSocket sessions its server accepts here
CLK_TCK = os.sysconf("SC_CLK_TCK")


# -- tiny HTTP/1.1 client ---------------------------------------------------------------------
class HTTPError(RuntimeError):
    pass


class Conn(asyncio.Protocol):
    """One keep-alive connection; one request in flight at a time."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self.episode = ""  # palaestra: the episode this connection steps

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses

    def connection_lost(self, exc: Exception | None) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(HTTPError(f"connection lost: {exc}"))

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if self.waiter is None:
            return
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return
        head = bytes(self.buf[:end]).lower()
        at = head.find(b"\r\ncontent-length:")
        if at >= 0:
            stop = head.find(b"\r\n", at + 2)
            length = int(head[at + 17 : stop if stop >= 0 else len(head)])
        elif head[9:12] in (b"204", b"304"):
            length = 0
        else:
            self.waiter.set_exception(HTTPError(f"no content-length in {head[:300]!r}"))
            self.waiter = None
            return
        total = end + 4 + length
        if len(self.buf) < total:
            return
        status = int(head[9:12])
        body = bytes(self.buf[end + 4 : total])
        del self.buf[:total]
        waiter, self.waiter = self.waiter, None
        waiter.set_result((status, body))

    async def request(self, data: bytes) -> tuple[int, bytes]:
        assert self.transport is not None
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(data)
        return await self.waiter

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


async def connect(port: int) -> Conn:
    loop = asyncio.get_running_loop()
    _, conn = await loop.create_connection(Conn, "127.0.0.1", port)
    sock = conn.transport.get_extra_info("socket") if conn.transport else None
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn


def _auth(token: str) -> str:
    return f"Authorization: Bearer {token}\r\n" if token else ""


def post(path: str, body: Any, port: int, token: str = "") -> bytes:
    payload = json.dumps(body, separators=(",", ":")).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{_auth(token)}"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    )
    return head.encode() + payload


def get(path: str, port: int, token: str = "") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{_auth(token)}\r\n".encode()


def delete(path: str, port: int, token: str = "") -> bytes:
    return (
        f"DELETE {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{_auth(token)}"
        "Content-Length: 0\r\n\r\n"
    ).encode()


async def checked(conn: Conn, data: bytes, ok: tuple[int, ...] = (200,)) -> bytes:
    status, body = await conn.request(data)
    if status not in ok:
        raise HTTPError(f"HTTP {status}: {body[:300]!r}")
    return body


# -- the two servers --------------------------------------------------------------------------
@dataclass
class Target:
    name: str
    port: int
    proc: subprocess.Popen[bytes]
    log: Path
    token: str = ""  # palaestra: the local admin token its data dir holds
    task: str = ECHO_TASK  # palaestra: the echo task each client opens

    async def open_client(self) -> tuple[Conn, bytes]:
        """A connection and the pre-built bytes of one no-op step on it."""
        raise NotImplementedError

    async def close_client(self, conn: Conn) -> None:
        conn.close()

    def cpu_s(self) -> float:
        """CPU time (user + system, all threads) the server process has used so far."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK


class Palaestra(Target):
    async def open_client(self) -> tuple[Conn, bytes]:
        conn = await connect(self.port)
        reset = {"task": self.task, "options": {"max_steps": 1_000_000_000}}
        body = json.loads(await checked(conn, post("/v1/episodes", reset, self.port, self.token)))
        episode = body["episode_id"]
        step = post(
            f"/v1/episodes/{episode}/step",
            {"action": {"tool": "echo", "arguments": {"text": "hi"}}},
            self.port,
            self.token,
        )
        reply = json.loads(await checked(conn, step))
        if reply["observation"]["text"] != "hi" or reply["terminated"] or reply["truncated"]:
            raise HTTPError(f"unexpected palaestra step reply: {reply}")
        conn.episode = episode
        return conn, step

    async def close_client(self, conn: Conn) -> None:
        closing = delete(f"/v1/episodes/{conn.episode}", self.port, self.token)
        await checked(conn, closing, ok=(200, 204))
        conn.close()


class OpenEnv(Target):
    async def open_client(self) -> tuple[Conn, bytes]:
        conn = await connect(self.port)
        await checked(conn, post("/reset", {}, self.port))
        step = post("/step", {"action": {"message": "hi"}}, self.port)
        reply = json.loads(await checked(conn, step))
        if reply["observation"]["echoed_message"] != "hi":
            raise HTTPError(f"unexpected OpenEnv step reply: {reply}")
        return conn, step


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_ready(
    proc: subprocess.Popen[bytes], port: int, path: str, log: Path, timeout_s: float = 60.0
) -> None:
    deadline = time.monotonic() + timeout_s
    request = f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}; log:\n{log.read_text()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(request)
                if s.recv(64).startswith(b"HTTP/1.1 200"):
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise SystemExit(
        f"server on port {port} not ready after {timeout_s:g} s; log:\n{log.read_text()}"
    )


def openenv_venv() -> Path:
    settings, sources = load_settings_with_sources()  # a cache named by PALAESTRA_CACHE
    named = sources["cache"] != "default"
    venv = settings.cache / "openenv-venv" if named else ROOT / "bench" / ".openenv" / "venv"
    py = venv / "bin" / "python"
    need = ["openenv", "uvloop", "httptools"]
    probe = "import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in %r))"
    if py.exists() and subprocess.run([py, "-c", probe % need]).returncode == 0:
        return venv
    print(f"installing openenv=={OPENENV_VERSION} into {venv} ...", file=sys.stderr, flush=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    if not py.exists():
        subprocess.run([shutil.which("python3") or sys.executable, "-m", "venv", venv], check=True)
    log = venv / "pip-install.log"
    with log.open("wb") as out:
        # uvloop + httptools (uvicorn[standard]) so both servers use the same HTTP stack.
        rc = subprocess.run(
            [py, "-m", "pip", "install", f"openenv=={OPENENV_VERSION}", "uvloop", "httptools"],
            stdout=out,
            stderr=subprocess.STDOUT,
        ).returncode
    if rc != 0:
        raise SystemExit(f"pip install openenv failed; see {log}")
    return venv


@contextlib.contextmanager
def servers(workdir: Path) -> Iterator[tuple[Palaestra, OpenEnv]]:
    procs: list[subprocess.Popen[bytes]] = []
    # One episode a client steps for the whole run: the operator raises the step ceiling.
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PALAESTRA_CEILING_STEPS": "1000000000"}
    try:
        # palaestra: its own CLI (uvicorn, log level warning, access log off).
        p_port, p_log = free_port(), workdir / "palaestra.log"
        palaestra_bin = ROOT / ".venv" / "bin" / "palaestra"
        cmd = [
            str(palaestra_bin) if palaestra_bin.exists() else "palaestra",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(p_port),
            "--data-dir",
            str(workdir / "palaestra-data"),
            "--log-level",
            "warning",
        ]
        with p_log.open("wb") as out:
            p_proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdout=out, stderr=out)
        procs.append(p_proc)

        # OpenEnv: its echo_env template, rendered by its CLI, served by uvicorn.
        venv = openenv_venv()
        render = workdir / "openenv"
        subprocess.run(
            [venv / "bin" / "openenv", "init", "echo_env", "--output-dir", render],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        # Its template allows one WebSocket session; the batch phase opens many.
        app_py = render / "echo_env" / "server" / "app.py"
        app_py.write_text(
            app_py.read_text().replace(
                "max_concurrent_envs=1,", f"max_concurrent_envs={OPENENV_WS_SESSIONS},"
            )
        )
        o_port, o_log = free_port(), workdir / "openenv.log"
        cmd = [
            str(venv / "bin" / "uvicorn"),
            "server.app:app",
            "--host",
            "127.0.0.1",
            "--port",
            str(o_port),
            "--workers",
            "1",
            "--log-level",
            "warning",
            "--no-access-log",
            "--loop",
            "uvloop",
            "--http",
            "httptools",
        ]
        with o_log.open("wb") as out:
            o_proc = subprocess.Popen(cmd, cwd=render / "echo_env", env=env, stdout=out, stderr=out)
        procs.append(o_proc)

        wait_ready(p_proc, p_port, "/readyz", p_log)
        wait_ready(o_proc, o_port, "/health", o_log)
        # Every /v1 request carries a bearer token: the admin token written at first start.
        token = (workdir / "palaestra-data" / "admin.token").read_text().strip()
        yield (
            Palaestra("palaestra", p_port, p_proc, p_log, token),
            OpenEnv("OpenEnv", o_port, o_proc, o_log),
        )
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
