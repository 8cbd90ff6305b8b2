"""`palaestra pack publish` and `palaestra pack install`: the server's pack registry from the CLI.

    palaestra pack publish DIR_OR_ARCHIVE --url URL --token T   # prints the pack digest
    palaestra pack install org/name@1.0.0 --url URL [--token T] # into the local data dir
    palaestra pack install FILE.tar.gz [--data-dir D]
    palaestra pack enable org/name --url URL --token ADMIN      # joins unfiltered sampling
    palaestra pack yank org/name@1.0.0 [--undo] --url URL --token T  # withdraw a version

Publishing sends the archive (built from a directory with the same deterministic
`pack_archive` as `pack build`; the directory is not changed) to `POST /v1/packs`, which
verifies it and refuses a published version with other bytes. Installing downloads
`GET /v1/packs/{org}/{name}@{version}/archive`, checks that its pack digest is the one the
server lists, and installs it into the local data dir's content-addressed store, where
`palaestra serve` and the embedded server load it at start.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer

from palaestra.cli.clients import local_database, resolve_token, settings_for
from palaestra.cli.console import console, error
from palaestra.cli.materialize import generate_in_sandboxes
from palaestra.cli.options import StoreUrl, Token, Url
from palaestra.sdk.errors import PalaestraError, error_from_response
from palaestra.server import heldout
from palaestra.server.db import Database
from palaestra.server.families import FamilyRegistry
from palaestra.server.packs.archive import ArchiveError, pack_archive
from palaestra.server.packs.loader import GeneratedSet
from palaestra.server.packs.manifest import PackManifest
from palaestra.server.packs.registry import PackRegistry

DataDir = Annotated[
    Path | None,
    typer.Option(help="local data dir (install target; its admin.token is used with --url)"),
]


def _fail(message: str) -> typer.Exit:
    error(message)
    return typer.Exit(2)


def _raise_for(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        body = response.json()
    except ValueError:
        body = response.text
    raise error_from_response(response.status_code, body)


def publish_archive(
    url: str, token: str | None, data: bytes, timeout: float = 600.0
) -> dict[str, Any]:
    """POST the archive; returns the server's reply (name, version, digest, created)."""
    headers = {"content-type": "application/gzip"}
    if token:
        headers["authorization"] = f"Bearer {token}"
    response = httpx.post(
        f"{url.rstrip('/')}/v1/packs", content=data, headers=headers, timeout=timeout
    )
    _raise_for(response)
    reply: dict[str, Any] = response.json()
    return reply


def download_archive(
    url: str, token: str | None, ref: str, timeout: float = 600.0
) -> tuple[bytes, str]:
    """The archive of `org/name@version` and the pack digest the server lists for it."""
    headers = {"authorization": f"Bearer {token}"} if token else {}
    base = url.rstrip("/")
    with httpx.Client(base_url=base, headers=headers, timeout=timeout) as http:
        info = http.get(f"/v1/packs/{ref}")
        _raise_for(info)
        listed = str(info.json()["digest"])
        response = http.get(f"/v1/packs/{ref}/archive")
        _raise_for(response)
    sent = response.headers.get("x-palaestra-digest")
    if sent and sent != listed:
        raise PalaestraError(
            f"the server lists {ref} as {listed} but sent an archive marked {sent}",
            code="digest_mismatch",
        )
    return response.content, listed


def register(pack_app: typer.Typer) -> None:
    """Add `publish` and `install` to the `pack` command group."""

    @pack_app.command("publish")
    def publish_cmd(
        source: Annotated[Path, typer.Argument(help="a pack directory or a .tar.gz archive")],
        url: Url = None,
        token: Token = None,
        data_dir: DataDir = None,
    ) -> None:
        """Publish a pack to a server (token with the `publish` scope); prints its digest."""
        if not url:
            raise _fail("--url (or PALAESTRA_URL) is needed: publishing goes to a server")
        try:
            data = pack_archive(source) if source.is_dir() else source.read_bytes()
        except (ArchiveError, OSError) as exc:
            raise _fail(str(exc)) from None
        try:
            reply = publish_archive(url, resolve_token(token, data_dir), data)
        except PalaestraError as exc:
            raise _fail(f"({exc.code}) {exc.message}") from None
        except httpx.HTTPError as exc:
            raise _fail(f"{url}: {exc!r}") from None
        what = "published" if reply.get("created") else "already published (same bytes)"
        console.print(f"{reply['name']}@{reply['version']} {what}")
        print(reply["digest"])

    @pack_app.command("enable")
    def enable_cmd(
        name: Annotated[str, typer.Argument(help="org/name of a published pack")],
        url: Url = None,
        token: Token = None,
        data_dir: DataDir = None,
        store: StoreUrl = None,
    ) -> None:
        """Let a published pack join unfiltered sampling (an admin's decision; a pack a
        publish token publishes is held out until then). Without --url: the local store."""
        try:
            if url:
                headers = {}
                resolved = resolve_token(token, data_dir)
                if resolved:
                    headers["authorization"] = f"Bearer {resolved}"
                response = httpx.post(
                    f"{url.rstrip('/')}/v1/packs/{name}/enable", headers=headers, timeout=60
                )
                _raise_for(response)
                changed = bool(response.json()["changed"])
            else:
                settings = settings_for(data_dir, store)
                with local_database(settings) as db:
                    registry = PackRegistry(settings.data_dir, db)
                    changed = registry.enable(name, "cli (local data dir)")
        except PalaestraError as exc:
            raise _fail(f"({exc.code}) {exc.message}") from None
        except httpx.HTTPError as exc:
            raise _fail(f"{url}: {exc!r}") from None
        console.print(f"{name} {'enabled' if changed else 'was already enabled'}")

    @pack_app.command("yank")
    def yank_cmd(
        ref: Annotated[str, typer.Argument(help="org/name@version of a published pack")],
        undo: Annotated[bool, typer.Option("--undo", help="restore a yanked version")] = False,
        url: Url = None,
        token: Token = None,
        data_dir: DataDir = None,
        store: StoreUrl = None,
    ) -> None:
        """Withdraw a published version (its publisher or an admin): `org/name` and sampling
        skip it, `org/name@version` and its digest still reach it. Without --url: the local
        store."""
        from palaestra.sdk.http import HTTPClient

        if "@" not in ref:
            raise _fail("name the version: org/name@version")
        try:
            if url:
                with HTTPClient(url, token=resolve_token(token, data_dir)) as client:
                    changed = client.yank(ref, undo=undo).changed
            else:
                settings = settings_for(data_dir, store)
                name, _, version = ref.partition("@")
                by = "cli (local data dir)"
                with local_database(settings) as db:
                    registry = PackRegistry(settings.data_dir, db)
                    changed = registry.yank(name, version, by, admin=True, undo=undo)
        except PalaestraError as exc:
            raise _fail(f"({exc.code}) {exc.message}") from None
        state = "unyanked" if undo else "yanked"
        console.print(f"{ref} {state if changed else 'was already ' + state}")

    @pack_app.command("install")
    def install_cmd(
        target: Annotated[
            str, typer.Argument(help="org/name@version (with --url) or a .tar.gz archive")
        ],
        url: Url = None,
        token: Token = None,
        data_dir: DataDir = None,
        store: StoreUrl = None,
        as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
    ) -> None:
        """Install a pack into the local data dir's store (loaded by the server at start)."""
        settings = settings_for(data_dir, store)
        expect: str | None = None
        path = Path(target)
        db: Database | None = None
        try:
            if path.is_file():
                data = path.read_bytes()
                source = str(path)
            else:
                if not url:
                    raise _fail(f"{target!r} is not a file; to download it pass --url")
                if "@" not in target:
                    raise _fail("name the version: org/name@version")
                data, expect = download_archive(url, resolve_token(token, data_dir), target)
                source = f"{url.rstrip('/')}/v1/packs/{target}"
            db = settings.database()
            registry = PackRegistry(settings.data_dir, db)
            families = [f.name for f in FamilyRegistry.discover().all()]
            secret = heldout.ensure_secret(
                settings.heldout_secret_file or settings.data_dir / heldout.SECRET_FILE
            )

            def generate(root: Path, manifest: PackManifest) -> GeneratedSet:
                # Anyone with a publish token may have written a generator pack: its
                # generators run in sandboxes here too, never in this (or the server's)
                # process; sealed splits are drawn with this data dir's secret.
                return generate_in_sandboxes(root, manifest, settings, secret)

            pack, created = registry.install(
                data,
                publisher=f"install from {source}",
                families=families,
                allow_code=True,  # [source] packs: only an admin could have published them
                expect_digest=expect,
                generate=generate,
            )
        except PalaestraError as exc:
            raise _fail(f"({exc.code}) {exc.message}") from None
        except (httpx.HTTPError, OSError) as exc:
            raise _fail(repr(exc)) from None
        finally:
            if db is not None:
                db.close()
        result = {
            "name": pack.name,
            "version": pack.version,
            "digest": pack.digest,
            "created": created,
            "path": str(registry.store.path_of(pack.digest)),
        }
        if as_json:
            print(json.dumps(result))
            return
        what = "installed" if created else "already installed"
        console.print(f"{pack.name}@{pack.version} {what} ({pack.digest}) in {settings.data_dir}")
