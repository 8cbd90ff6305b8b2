"""The options many commands share: which server, which token, which data dir.

`--url` and `--token` fall back to the `url` and `token` settings (PALAESTRA_URL,
PALAESTRA_TOKEN or palaestra.toml, shown by `palaestra config`), so the CLI reads no
variable of its own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from palaestra.server.config import load_settings


def url_setting(value: str | None) -> str | None:
    """`--url`, else the `url` setting."""
    return value or load_settings().url


def token_setting(value: str | None) -> str | None:
    """`--token`, else the `token` setting."""
    if value:
        return value
    token = load_settings().token
    return token.get_secret_value() if token is not None else None


def sandbox_setting(value: str | None) -> str:
    """`--sandbox`, else the `sandbox` setting."""
    return value or load_settings().sandbox


Url = Annotated[
    str | None,
    typer.Option(
        callback=url_setting, help="server URL (setting `url`); without it an embedded server runs"
    ),
]
Token = Annotated[
    str | None, typer.Option(callback=token_setting, help="bearer token (setting `token`)")
]
DataDir = Annotated[Path | None, typer.Option(help="data dir of the embedded server")]
StoreUrl = Annotated[
    str | None,
    typer.Option(
        "--store",
        help="the database (setting `store`): postgresql://USER:PASSWORD@HOST/DB or "
        "sqlite://PATH; default SQLite in the data dir",
    ),
]
