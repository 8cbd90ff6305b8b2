"""How CLI commands reach a server: over HTTP with `--url`, else an embedded one."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from palaestra.cli.console import err
from palaestra.sdk.client import AsyncClient
from palaestra.sdk.errors import UnavailableError
from palaestra.sdk.http import AsyncHTTPClient
from palaestra.sdk.models import ResetResponse
from palaestra.server.auth import read_token_file
from palaestra.server.config import Settings, load_settings
from palaestra.server.db import Database
from palaestra.server.inprocess import AsyncInProcessClient
from palaestra.server.runtime import build_manager


def settings_for(data_dir: Path | None, store: str | None = None) -> Settings:
    return load_settings({"data_dir": data_dir, "store": store})


@contextlib.contextmanager
def local_database(settings: Settings) -> Iterator[Database]:
    """The database of these settings (the data dir's SQLite file, or `store`), closed after."""
    db = settings.database()
    try:
        yield db
    finally:
        db.close()


def resolve_token(token: str | None, data_dir: Path | None) -> str | None:
    """`--token` / PALAESTRA_TOKEN, else the local admin token of `--data-dir` (a server on
    this machine), else the one in the default data dir, if there is one."""
    if token:
        return token
    return read_token_file(data_dir if data_dir is not None else settings_for(None).data_dir)


@asynccontextmanager
async def open_client(
    url: str | None,
    token: str | None,
    data_dir: Path | None,
    *,
    read_only: bool = False,
    waits_for_warm: bool = False,
) -> AsyncIterator[AsyncClient]:
    """A client of `url`, else of an embedded server on the data dir. `read_only` (a
    command that only lists): where the data dir does not exist yet, the embedded server
    runs on a temporary one, so listing creates nothing. `waits_for_warm`: the command
    retries a `warming` reset (`reset_when_warm`), so packs not cached may warm in the
    background (settings.background_warm); any other command gets every pack warm first
    (a listing of a pack still warming would fail)."""
    if url:
        async with AsyncHTTPClient(url, token=resolve_token(token, data_dir)) as http:
            yield http
        return
    settings = settings_for(data_dir)
    with contextlib.ExitStack() as stack:
        if read_only and not settings.data_dir.exists():
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="palaestra-list-"))
            settings = settings.model_copy(update={"data_dir": Path(tmp)})
        # In a thread: a Ctrl-C while the packs load stops the command at once. A run of
        # one task never waits for the packs it does not play.
        background = waits_for_warm and settings.background_warm
        manager = await asyncio.to_thread(build_manager, settings, background_warm=background)
        await manager.start()
        try:
            yield AsyncInProcessClient(manager)
        finally:
            await manager.shutdown()


WARM_WAIT_S = 900.0  # how long `palaestra run` waits for its task's pack to be generated
POLL_S = 5.0  # asks again at least this often (and says how far the generation is)


async def reset_when_warm(
    client: AsyncClient, task: str, options: dict[str, Any], *, wait_s: float = WARM_WAIT_S
) -> ResetResponse:
    """A reset that waits while the task's pack is generated (503 `warming`: a server, or
    the embedded one, started a moment ago on a fresh cache), saying so on stderr."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return await client.reset(task, options=options)
        except UnavailableError as exc:
            left = deadline - time.monotonic()
            if exc.code != "warming" or left <= 0:
                raise
            err.print(f"waiting: {exc.message}")
            await asyncio.sleep(min(exc.retry_after or POLL_S, POLL_S, left))
