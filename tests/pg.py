"""A real throwaway PostgreSQL server for the tests (one per session; conftest's `pg_url`).

initdb in a temp dir, a free port on loopback, the unix socket in that dir, fsync off;
`pg_ctl -m fast stop` and the dir removed at the end. initdb refuses to run as root, so as
root the server runs as the `postgres` user (the OS package's). Where PostgreSQL is not
installed (scripts/bootstrap.sh installs it as root), `PostgresServer.start` raises
PostgresUnavailable with the reason, and the PostgreSQL tests skip with it.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path

PASSWORD_ROLE = "pw_user"  # a role that logs in by password (scram), not by trust


class PostgresUnavailable(Exception):
    """Why no test server could be started (the tests that need one skip with it)."""


def bin_dir() -> Path | None:
    """The newest installed PostgreSQL's bin folder (Debian: /usr/lib/postgresql/N/bin)."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4])
    )
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


class PostgresServer:
    def __init__(self) -> None:
        self.root: Path | None = None
        self.port = 0
        self.prefix: list[str] = []
        self.bin: Path | None = None

    @property
    def url(self) -> str:
        """The admin URL (database `postgres`)."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        done = subprocess.run(
            [*self.prefix, *args], capture_output=True, text=True, timeout=60, check=False
        )
        if done.returncode != 0:
            log = self.root / "pg.log" if self.root else None
            tail = log.read_text()[-2000:] if log and log.exists() else ""
            raise PostgresUnavailable(
                f"{Path(args[0]).name} failed ({done.returncode}): {done.stderr.strip()} {tail}"
            )

    def start(self) -> PostgresServer:
        self.bin = bin_dir()
        if self.bin is None:
            raise PostgresUnavailable(
                "PostgreSQL is not installed (as root: apt-get install postgresql; "
                "scripts/bootstrap.sh does it)"
            )
        self.root = Path(tempfile.mkdtemp(prefix="palaestra-pg-"))
        if os.geteuid() == 0:  # initdb: "cannot be run as root"
            try:
                user = pwd.getpwnam("postgres")
            except KeyError:
                user = pwd.getpwnam("nobody")
            os.chown(self.root, user.pw_uid, user.pw_gid)
            self.prefix = ["runuser", "-u", user.pw_name, "--"]
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        data = self.root / "data"
        self._run(
            str(self.bin / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres",
            "--no-sync", "-E", "UTF8",
        )  # fmt: skip
        # One role that must give its password (the wrong-password test); the rest: trust.
        hba = data / "pg_hba.conf"
        hba.write_text(f"host all {PASSWORD_ROLE} 127.0.0.1/32 scram-sha-256\n" + hba.read_text())
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
            " -c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
        )
        self._run(
            str(self.bin / "pg_ctl"), "-D", str(data), "-l", str(self.root / "pg.log"),
            "-o", options, "-w", "-t", "30", "start",
        )  # fmt: skip
        return self

    def create_database(self) -> str:
        """A fresh, empty database; its URL."""
        import psycopg

        name = f"t_{uuid.uuid4().hex[:16]}"
        with psycopg.connect(self.url, autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {name}")
        return f"postgresql://postgres@127.0.0.1:{self.port}/{name}"

    def drop_database(self, url: str) -> None:
        import psycopg

        name = url.rsplit("/", 1)[1]
        with psycopg.connect(self.url, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    def stop(self) -> None:
        if self.root is None:
            return
        if self.bin is not None and (self.root / "data" / "postmaster.pid").exists():
            with contextlib.suppress(PostgresUnavailable):  # the log says why; the dir goes
                self._run(str(self.bin / "pg_ctl"), "-D", str(self.root / "data"), "-m", "fast",
                          "-w", "stop")  # fmt: skip
        shutil.rmtree(self.root, ignore_errors=True)
        self.root = None
