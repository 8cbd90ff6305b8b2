"""The `palaestra` command: serve, discover, run one episode, evaluate."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from palaestra.cli.atif import export_app as atif_export_app
from palaestra.cli.atif import import_app as atif_import_app
from palaestra.cli.clients import open_client, reset_when_warm
from palaestra.cli.conformance import register as register_conformance_command
from palaestra.cli.console import console, err, error, styled
from palaestra.cli.eval.app import eval_app
from palaestra.cli.images import images_app
from palaestra.cli.materialize import register as register_materialize_command
from palaestra.cli.options import DataDir, StoreUrl, Token, Url
from palaestra.cli.pack import pack_app
from palaestra.cli.pack_export import export_app
from palaestra.cli.pack_import import import_app
from palaestra.cli.registry import register as register_registry_commands
from palaestra.cli.tokens import token_app
from palaestra.cli.train import register as register_train_command
from palaestra.sdk.client import AsyncClient
from palaestra.sdk.errors import PalaestraError
from palaestra.sdk.models import Action, EpisodeState, StepResponse
from palaestra.server.config import load_settings, load_settings_with_sources

app = typer.Typer(
    help="palaestra: sandboxed environments and verifiers for LLM post-training.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(images_app, name="images")
app.add_typer(pack_app, name="pack")
register_registry_commands(pack_app)  # pack publish, pack install
register_materialize_command(pack_app)  # pack materialize
pack_app.add_typer(import_app, name="import")  # pack import terminal-bench|harbor|finqa
pack_app.add_typer(export_app, name="export")  # pack export harbor
app.add_typer(token_app, name="token")
app.add_typer(eval_app, name="eval")  # eval run / resume / report / compare (cli/eval/)
app.add_typer(atif_export_app, name="export")  # export atif (cli/atif.py)
app.add_typer(atif_import_app, name="import")  # import atif
register_train_command(app)  # palaestra train (cli/train.py)
register_conformance_command(app)  # palaestra conformance URL (cli/conformance.py)


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="bind address")] = None,
    port: Annotated[int | None, typer.Option(help="port")] = None,
    data_dir: DataDir = None,
    store: StoreUrl = None,
    sandbox: Annotated[str | None, typer.Option(help="sandbox backend")] = None,
    max_episodes: Annotated[int | None, typer.Option(help="live episodes before 429")] = None,
    idle_ttl_s: Annotated[float | None, typer.Option(help="idle episode TTL (s)")] = None,
    log_level: Annotated[str | None, typer.Option(help="debug, info, warning")] = None,
    auth: Annotated[
        str | None,
        typer.Option(help="token (default) | off: everyone is admin, local experiments only"),
    ] = None,
    packs: Annotated[
        list[Path] | None,
        typer.Option(
            "--packs",
            help="serve the packs in this folder (a pack folder, or a folder of them) "
            "instead of the built-in packs/; repeat for more (the packs_dirs setting)",
        ),
    ] = None,
    ray: Annotated[
        str | None,
        typer.Option(
            "--ray",
            help="host episodes on Ray workers: ADDRESS (host:port), auto, or local:N "
            "(an N-node cluster on this machine); see docs/operations.md",
        ),
    ] = None,
    background_warm: Annotated[
        bool | None,
        typer.Option(
            "--background-warm/--no-background-warm",
            help="generate packs not cached yet in the background while serving the others "
            "(default), or before answering at all",
        ),
    ] = None,
) -> None:
    """Run the HTTP server on the embedded defaults (bwrap, SQLite, built-in packs).

    At first start it writes a local admin token to <data dir>/admin.token (mode 0600).
    With --ray it is a cluster front: the same API, episodes on Ray workers."""
    import uvicorn

    from palaestra.server.app import create_app
    from palaestra.server.guards import uvicorn_options
    from palaestra.server.hotconn import hot_protocol
    from palaestra.server.logs import configure_logging

    settings = load_settings(
        {
            "host": host,
            "port": port,
            "data_dir": data_dir,
            "store": store,
            "sandbox": sandbox,
            "max_episodes": max_episodes,
            "idle_ttl_s": idle_ttl_s,
            "log_level": log_level,
            "auth": auth,
            "packs_dirs": packs or None,
            "ray": ray,
            "background_warm": background_warm,
        }
    )
    configure_logging(settings.log_level)
    try:  # a wrong store URL is told now, with what to fix, not as a start-up traceback
        settings.database().close()
    except PalaestraError as exc:
        error(exc.message, exc.code)
        raise typer.Exit(2) from None
    if settings.sandbox in ("bwrap", "docker"):
        from palaestra.server import served

        try:  # a location the sandboxes cannot use is told now, not as a void episode later
            served.preflight(settings.sandbox)
        except served.ServeError as exc:
            error(str(exc), "sandbox_location")
            raise typer.Exit(2) from None
    if settings.ray:
        from palaestra.server.cluster.connect import ClusterError, check_cluster

        try:  # before the app starts: a clear error (unreachable, unauthenticated), no traceback
            check_cluster(settings)
        except ClusterError as exc:
            error(str(exc), exc.code)
            raise typer.Exit(2) from None
    api = create_app(settings, freeze_gc=True)
    options = uvicorn_options(settings)  # connection, header and shutdown bounds (Settings)
    options["http"] = hot_protocol(options["http"], api)  # steps answered by the connection
    uvicorn.run(
        api,
        host=settings.host,
        port=settings.port,
        log_level="warning",
        access_log=False,
        **options,
    )


@app.command()
def config(
    as_json: Annotated[
        bool, typer.Option("--json", help='as JSON: {name: {"value", "from"}}')
    ] = False,
) -> None:
    """Print every setting, its value and where it came from (PALAESTRA_<NAME>, palaestra.toml
    or the default), grouped by concern; secrets are shown redacted."""
    settings, sources = load_settings_with_sources()
    values = settings.model_dump(mode="json")  # a SecretStr dumps as "**********"
    groups = settings.groups()
    if as_json:
        doc = {
            name: {"value": values[name], "from": sources[name]}
            for names in groups.values()
            for name in names
        }
        console.print_json(json.dumps(doc))
        return
    table = Table("setting", "value", "from", title="palaestra settings")
    for group, names in groups.items():
        table.add_row(styled(f"{group} settings", "bold"), "", "")  # no toml table: keys are flat
        for name in names:
            value = values[name]
            shown = value if isinstance(value, str) else json.dumps(value)
            table.add_row(name, shown, sources[name], end_section=name == names[-1])
    console.print(table)


def _run(coro: Any) -> Any:
    try:
        return asyncio.run(coro)
    except PalaestraError as exc:
        error(exc.message, exc.code)
        raise typer.Exit(2) from None


@app.command()
def families(url: Url = None, token: Token = None, data_dir: DataDir = None) -> None:
    """List the families and their tools (and those that failed to import, with why)."""

    async def go() -> None:
        async with open_client(url, token, data_dir, read_only=True) as client:
            listed = await client.families()
            total = sum(len(f.domains) for f in listed)
            table = Table("family", "domains", "tools", "description", title=f"{total} domains")
            broken = [f for f in listed if f.error is not None]
            for f in listed:
                if f.error is not None:
                    table.add_row(f.name, "-", "-", styled("broken", "red", " (see below)"))
                    continue
                table.add_row(
                    f.name, str(len(f.domains)), ", ".join(t.name for t in f.tools), f.description
                )
            console.print(table)
            for f in broken:
                console.print(styled("broken", "red", f" {f.error}"), soft_wrap=True)

    _run(go())


@app.command()
def tasks(
    pack: Annotated[str | None, typer.Option(help="org/name[@version]")] = None,
    split: Annotated[str | None, typer.Option()] = None,
    family: Annotated[str | None, typer.Option()] = None,
    domain: Annotated[str | None, typer.Option()] = None,
    limit: Annotated[int, typer.Option()] = 50,
    url: Url = None,
    token: Token = None,
    data_dir: DataDir = None,
) -> None:
    """List tasks (public fields only)."""

    async def go() -> None:
        async with open_client(url, token, data_dir, read_only=True) as client:
            listing = await client.tasks(
                pack=pack, split=split, family=family, domain=domain, limit=limit
            )
            table = Table("task", "family", "domain", "split", title=f"{listing.total} tasks")
            for t in listing.tasks:
                table.add_row(t.id, t.family, t.domain, t.split)
            console.print(table)

    _run(go())


@app.command()
def run(
    task: Annotated[str, typer.Argument(help="org/name[@version]:task_id")],
    policy: Annotated[
        str, typer.Option(help="oracle | null | interactive | script")
    ] = "interactive",
    script: Annotated[
        Path | None, typer.Option(help="JSON lines of actions, for --policy script")
    ] = None,
    harness: Annotated[
        str | None,
        typer.Option(help="run a harness in the sandbox instead (docs/harness.md): its name"),
    ] = None,
    model_endpoint: Annotated[
        str | None, typer.Option(help="with --harness: the model server's base URL (…/v1)")
    ] = None,
    model: Annotated[
        str | None, typer.Option(help="with --harness: model name (default: the endpoint's)")
    ] = None,
    sampling: Annotated[
        str | None, typer.Option(help='with --harness: JSON, e.g. {"temperature": 1.0}')
    ] = None,
    harness_config: Annotated[
        str | None, typer.Option("--config", help="with --harness: its settings, JSON")
    ] = None,
    max_calls: Annotated[int | None, typer.Option(help="with --harness: model calls")] = None,
    max_tokens: Annotated[
        int | None, typer.Option(help="with --harness: completion tokens in all")
    ] = None,
    url: Url = None,
    token: Token = None,
    data_dir: DataDir = None,
) -> None:
    """Run one episode, scripted or interactively (actions as JSON: {"tool": …, "arguments": …}),
    or with --harness: a harness in the sandbox, then its verdict and model calls."""
    if harness is not None:
        limits = (max_calls, max_tokens)
        _run_harness(task, harness, model_endpoint, model, sampling, harness_config, limits,
                     (url, token, data_dir))  # fmt: skip
        return

    async def go() -> None:
        async with open_client(url, token, data_dir, waits_for_warm=True) as client:
            await _one_episode(client, task, policy, script)

    _run(go())


def _run_harness(
    task: str,
    name: str,
    endpoint: str | None,
    model: str | None,
    sampling: str | None,
    config: str | None,
    limits: tuple[int | None, int | None],
    server: tuple[str | None, str | None, Path | None],
) -> None:
    from palaestra.cli import harness_run as hr

    if not endpoint:
        error("--harness needs --model-endpoint URL (the model server's base URL, …/v1)")
        raise typer.Exit(2)

    async def go() -> EpisodeState:
        chosen = model or await hr.served_model(endpoint)
        options = hr.harness_options(name, endpoint, chosen, sampling, config, *limits)
        async with open_client(*server, waits_for_warm=True) as client:
            return await hr.run_harness(client, task, options)

    try:
        state = _run(go())
    except hr.HarnessArgumentError as exc:
        error(str(exc), "bad_option")
        raise typer.Exit(2) from None
    if state.status == "void":
        raise typer.Exit(1)


async def _one_episode(client: AsyncClient, task: str, policy: str, script: Path | None) -> None:
    options = {"oracle": True} if policy == "oracle" else {}
    reset = await reset_when_warm(client, task, options)
    console.rule(f"episode {reset.episode_id}")
    console.print(reset.observation.text)
    console.print("tools: " + ", ".join(t.name for t in reset.tools))
    scripted = (
        [json.loads(line) for line in script.read_text().splitlines() if line.strip()]
        if script
        else []
    )
    last: StepResponse | None = None
    while last is None or not (last.terminated or last.truncated):
        if policy == "oracle":
            action: Any = Action(tool="oracle")
        elif policy == "null":
            action = Action(tool="submit")
        elif policy == "script":
            if not scripted:
                break
            action = scripted.pop(0)
        else:
            line = console.input(styled("action>", "bold", " "))
            try:
                action = json.loads(line)
            except json.JSONDecodeError:
                err.print('type JSON like {"tool": "submit", "arguments": {}}')
                continue
        try:
            last = await client.step(reset.episode_id, action)
        except PalaestraError as exc:
            err.print(styled(exc.code, "yellow", f": {exc.message}"))
            if exc.status != 422:
                raise
            continue
        console.print(last.observation.text)
    verdict = await client.verify(reset.episode_id)
    console.print_json(verdict.model_dump_json())
    await client.close(reset.episode_id)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
