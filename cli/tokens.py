"""`palaestra token create|list|revoke`: bearer tokens in a data dir's store (server/auth.py).

They work on the database of `--data-dir` (the server's, on its machine) or `--store`, or, with
`--url`, over HTTP with an admin token. A token is printed once, when it is made.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.table import Table

from palaestra.cli.clients import local_database, resolve_token, settings_for
from palaestra.cli.console import console, error
from palaestra.cli.options import StoreUrl, token_setting
from palaestra.sdk.errors import PalaestraError, error_from_response
from palaestra.server import auth

token_app = typer.Typer(help="Make, list and revoke bearer tokens.", no_args_is_help=True)

Url = Annotated[
    str | None, typer.Option(help="manage the tokens of this server over HTTP (admin token)")
]
Token = Annotated[
    str | None, typer.Option(callback=token_setting, help="admin token (--url; setting `token`)")
]
DataDir = Annotated[Path | None, typer.Option(help="the server's data dir")]


def _http(url: str, token: str | None, method: str, path: str, **kwargs: Any) -> httpx.Response:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    response = httpx.request(method, f"{url.rstrip('/')}{path}", headers=headers, **kwargs)
    if response.status_code >= 400:
        try:
            body: Any = response.json()
        except ValueError:
            body = response.text
        raise error_from_response(response.status_code, body)
    return response


def _guard(fn: Any) -> Any:
    try:
        return fn()
    except PalaestraError as exc:
        error(exc.message, exc.code)
        raise typer.Exit(2) from None


@token_app.command("create")
def create(
    scope: Annotated[
        list[str],
        typer.Option("--scope", help="train, eval, publish, harness or admin; repeatable"),
    ],
    name: Annotated[str | None, typer.Option(help="a name to list and revoke it by")] = None,
    org: Annotated[
        list[str] | None,
        typer.Option("--org", help="an org this publish token may publish into; repeatable"),
    ] = None,
    max_live: Annotated[
        int | None, typer.Option(min=0, help="live episodes at once (default: the server's)")
    ] = None,
    max_episodes_per_hour: Annotated[
        int | None, typer.Option(min=0, help="episodes started per hour (default: the server's)")
    ] = None,
    max_cpu_s_per_hour: Annotated[
        float | None,
        typer.Option(min=0, help="sandbox CPU-seconds per hour (default: the server's)"),
    ] = None,
    data_dir: DataDir = None,
    store: StoreUrl = None,
    url: Url = None,
    token: Token = None,
) -> None:
    """Make a token with the given scopes and print it (the only time it is shown)."""
    orgs = org or []
    quota = auth.Quota(max_live, max_episodes_per_hour, max_cpu_s_per_hour)

    def go() -> str:
        if url:
            body = {
                "scopes": scope,
                "name": name,
                "orgs": orgs,
                "max_live": max_live,
                "max_episodes_per_hour": max_episodes_per_hour,
                "max_cpu_s_per_hour": max_cpu_s_per_hour,
            }
            reply = _http(url, resolve_token(token, data_dir), "POST", "/v1/tokens", json=body)
            made: str = reply.json()["token"]
            return made
        with local_database(settings_for(data_dir, store)) as db:
            made, _ = auth.create_token(db, scope, name=name, orgs=orgs, quota=quota)
        return made

    print(_guard(go))


@token_app.command("list")
def list_(
    data_dir: DataDir = None,
    store: StoreUrl = None,
    url: Url = None,
    token: Token = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """The tokens (names, scopes, state; never the tokens themselves)."""

    def go() -> list[dict[str, Any]]:
        if url:
            rows: list[dict[str, Any]] = _http(
                url, resolve_token(token, data_dir), "GET", "/v1/tokens"
            ).json()
            return rows
        with local_database(settings_for(data_dir, store)) as db:
            return auth.list_tokens(db)

    rows = _guard(go)
    if as_json:
        print(json.dumps(rows))
        return
    table = Table("id", "name", "scopes", "orgs", "state")
    for row in rows:
        state = "revoked" if row["revoked"] else "live"
        table.add_row(row["id"], row["name"], " ".join(row["scopes"]), " ".join(row["orgs"]), state)
    console.print(table)


@token_app.command("revoke")
def revoke(
    name: Annotated[str, typer.Argument(help="the token's name or id")],
    data_dir: DataDir = None,
    store: StoreUrl = None,
    url: Url = None,
    token: Token = None,
) -> None:
    """Revoke a token (a running server drops it within seconds; at once with --url)."""

    def go() -> None:
        if url:
            _http(url, resolve_token(token, data_dir), "DELETE", f"/v1/tokens/{name}")
            return
        with local_database(settings_for(data_dir, store)) as db:
            revoked = auth.revoke_token(db, name)
        if not revoked:
            raise PalaestraError(f"no live token named (or with id) {name!r}", code="not_found")

    _guard(go)
    console.print(f"revoked {name}")
