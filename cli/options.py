"""The options many commands share: which server, which token, which data dir.

`--url` and `--token` fall back to the `url` and `token` settings (PALAESTRA_URL,
PALAESTRA_TOKEN or palaestra.toml, shown by `palaestra config`), so the CLI reads no
variable of its own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from palaestra.server.config import Settings, load_settings


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


def judges_setting(values: list[str] | None) -> dict[str, Any]:
    """`--judge NAME=URL,MODEL` (repeatable), else the `judges` setting."""
    if not values:
        return dict(load_settings().judges)
    judges: dict[str, Any] = {}
    for value in values:
        name, _, rest = value.partition("=")
        url, _, model = rest.rpartition(",")
        if not (name and url and model):
            raise typer.BadParameter(
                "write NAME=URL,MODEL, e.g. default=http://127.0.0.1:8001/v1,qwen3-8b; "
                f"got {value!r}"
            )
        judges[name] = {"url": url, "model": model}
    try:
        Settings.model_validate({"judges": judges})
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'][1:])}: {e['msg']}" for e in exc.errors()
        )
        raise typer.BadParameter(problems) from None
    return judges


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
