"""`palaestra pack heldout`: the held-out draws of a generated pack's sealed splits.

    palaestra pack heldout show ORG/NAME --url URL
    palaestra pack heldout rotate ORG/NAME [--split heldout] --url URL   # an admin token

A rotation draws a new held-out set from the server's secret (server/draws.py); the
earlier draws are retired: never served for evaluation again, never to training. Without
--url, `rotate --split S` records the next draw in the local store (the data dir's, or
--store): a server on it serves that draw from its next start (or its schedule's next pass).
"""

from __future__ import annotations

import time
from typing import Annotated, Any

import httpx
import typer
from rich.table import Table

from palaestra.cli.clients import local_database, resolve_token, settings_for
from palaestra.cli.console import console, error
from palaestra.cli.options import DataDir, StoreUrl, Token, Url
from palaestra.sdk.errors import PalaestraError, error_from_response
from palaestra.sdk.heldout import HeldoutDraws
from palaestra.server.draws import DrawBook

heldout_app = typer.Typer(
    help="Held-out draws of a generated pack's sealed splits: show them, rotate to a new one.",
    no_args_is_help=True,
)

NameArg = Annotated[str, typer.Argument(help="org/name of a pack with a sealed generated split")]
SplitOpt = Annotated[str | None, typer.Option(help="the split to redraw (default: every one)")]


def _call(
    method: str, url: str, path: str, token: str | None, body: dict[str, Any] | None = None
) -> dict[str, Any]:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    reply = httpx.request(
        method, f"{url.rstrip('/')}{path}", json=body, headers=headers, timeout=600
    )
    if reply.status_code >= 400:
        try:
            detail = reply.json()
        except ValueError:
            detail = reply.text
        raise error_from_response(reply.status_code, detail)
    result: dict[str, Any] = reply.json()
    return result


def _show(draws: HeldoutDraws) -> None:
    table = Table("split", "draw", "retired", "drawn at", "by", "tasks", title=draws.pack)
    for row in draws.splits:
        retired = f"0–{row.draw - 1}" if row.draw else "-"
        when = time.strftime("%Y-%m-%d %H:%M", time.gmtime(row.drawn_at)) if row.drawn_at else "-"
        table.add_row(row.split, str(row.draw), retired, when, row.drawn_by or "-", str(row.tasks))
    console.print(table)


@heldout_app.command("show")
def show_cmd(name: NameArg, url: Url = None, token: Token = None, data_dir: DataDir = None) -> None:
    """The draw each sealed generated split of the pack serves now."""
    if not url:
        raise _fail("--url: the server whose draws to show")
    try:
        reply = _call("GET", url, f"/v1/packs/{name}/heldout", resolve_token(token, data_dir))
    except PalaestraError as exc:
        raise _fail(f"({exc.code}) {exc.message}") from None
    except httpx.HTTPError as exc:
        raise _fail(f"{url}: {exc!r}") from None
    _show(HeldoutDraws.model_validate(reply))


@heldout_app.command("rotate")
def rotate_cmd(
    name: NameArg,
    split: SplitOpt = None,
    url: Url = None,
    token: Token = None,
    data_dir: DataDir = None,
    store: StoreUrl = None,
) -> None:
    """Draw a new held-out set (admin): the earlier draws are retired, never served again.
    Eval runs record the draw they measured; `palaestra eval compare` across draws shows a
    model that memorised the old one as a drop."""
    try:
        if url:
            body = {"split": split} if split else {}
            path = f"/v1/packs/{name}/heldout/rotate"
            reply = _call("POST", url, path, resolve_token(token, data_dir), body)
            draws = HeldoutDraws.model_validate(reply)
        else:
            if not split:
                raise _fail("without --url, name the split to redraw (--split)")
            with local_database(settings_for(data_dir, store)) as db:
                book = DrawBook(db)
                seen = next((r.draw for r in book.rows(name) if r.split == split), 0)
                if not book.advance(name, split, seen, "cli (local store)", time.time()):
                    raise _fail(f"{name} {split}: rotated meanwhile; run it again")
            console.print(
                f"{name} {split}: draw {seen + 1} recorded (draws 0–{seen} retired); a server "
                "on this store serves it from its next start"
            )
            return
    except PalaestraError as exc:
        raise _fail(f"({exc.code}) {exc.message}") from None
    except httpx.HTTPError as exc:
        raise _fail(f"{url}: {exc!r}") from None
    for row in draws.splits:
        if row.previous is not None:
            console.print(
                f"{name} {row.split}: draw {row.draw} served, draw {row.previous} retired"
            )
    _show(draws)


def _fail(message: str) -> typer.Exit:
    error(message)
    return typer.Exit(1)
