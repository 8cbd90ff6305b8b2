"""The `palaestra` command: serve, discover, run one episode, evaluate."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

import palaestra
from palaestra.cli.clients import open_client
from palaestra.cli.images import images_app
from palaestra.cli.pack import pack_app
from palaestra.cli.registry import register as register_registry_commands
from palaestra.cli.tokens import token_app
from palaestra.sdk.client import AsyncClient
from palaestra.sdk.errors import PalaestraError
from palaestra.sdk.evaluation import Attempt, build_report, run_eval
from palaestra.sdk.models import Action, StepResponse
from palaestra.sdk.policies import ChatPolicy, NullPolicy, OraclePolicy, Policy
from palaestra.server.config import load_settings

app = typer.Typer(
    help="palaestra: sandboxed environments and verifiers for LLM post-training.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(images_app, name="images")
app.add_typer(pack_app, name="pack")
register_registry_commands(pack_app)  # pack publish, pack install
app.add_typer(token_app, name="token")
# Tables stay readable when the output is a pipe or a CI log (Rich would assume 80 columns).
console = Console(width=None if sys.stdout.isatty() else 120)
err = Console(stderr=True)

Url = Annotated[
    str | None,
    typer.Option(envvar="PALAESTRA_URL", help="server URL; without it an embedded server runs"),
]
Token = Annotated[str | None, typer.Option(envvar="PALAESTRA_TOKEN", help="bearer token")]
DataDir = Annotated[Path | None, typer.Option(help="data dir of the embedded server")]


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="bind address")] = None,
    port: Annotated[int | None, typer.Option(help="port")] = None,
    data_dir: DataDir = None,
    sandbox: Annotated[str | None, typer.Option(help="sandbox backend")] = None,
    max_episodes: Annotated[int | None, typer.Option(help="live episodes before 429")] = None,
    idle_ttl_s: Annotated[float | None, typer.Option(help="idle episode TTL (s)")] = None,
    log_level: Annotated[str | None, typer.Option(help="debug, info, warning")] = None,
    auth: Annotated[
        str | None,
        typer.Option(help="token (default) | off: everyone is admin, local experiments only"),
    ] = None,
) -> None:
    """Run the HTTP server on the embedded defaults (bwrap, SQLite, built-in packs).

    At first start it writes a local admin token to <data dir>/admin.token (mode 0600)."""
    import uvicorn

    from palaestra.server.app import create_app
    from palaestra.server.logs import configure_logging

    settings = load_settings(
        {
            "host": host,
            "port": port,
            "data_dir": data_dir,
            "sandbox": sandbox,
            "max_episodes": max_episodes,
            "idle_ttl_s": idle_ttl_s,
            "log_level": log_level,
            "auth": auth,
        }
    )
    configure_logging(settings.log_level)
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level="warning",
        access_log=False,
    )


@app.command()
def config() -> None:
    """Print the effective settings (flags > PALAESTRA_* > palaestra.toml > defaults)."""
    settings = load_settings()
    console.print_json(settings.model_dump_json())


def _run(coro: Any) -> Any:
    try:
        return asyncio.run(coro)
    except PalaestraError as exc:
        err.print(f"[red]error[/red] ({exc.code}): {exc.message}")
        raise typer.Exit(2) from None


@app.command()
def families(url: Url = None, token: Token = None, data_dir: DataDir = None) -> None:
    """List the families and their tools."""

    async def go() -> None:
        async with open_client(url, token, data_dir) as client:
            listed = await client.families()
            total = sum(len(f.domains) for f in listed)
            table = Table("family", "domains", "tools", "description", title=f"{total} domains")
            for f in listed:
                table.add_row(
                    f.name, str(len(f.domains)), ", ".join(t.name for t in f.tools), f.description
                )
            console.print(table)

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
        async with open_client(url, token, data_dir) as client:
            listing = await client.tasks(
                pack=pack, split=split, family=family, domain=domain, limit=limit
            )
            table = Table("task", "family", "domain", "split", title=f"{listing.total} tasks")
            for t in listing.tasks:
                table.add_row(t.id, t.family, t.domain, t.split)
            console.print(table)

    _run(go())


def make_policy(name: str, base_url: str | None, model: str | None, api_key_env: str) -> Policy:
    if name == "oracle":
        return OraclePolicy()
    if name == "null":
        return NullPolicy()
    if name == "chat":
        if not base_url or not model:
            raise typer.BadParameter("--policy chat needs --base-url and --model")
        return ChatPolicy(base_url=base_url, model=model, api_key_env=api_key_env)
    raise typer.BadParameter(f"unknown policy {name!r}: use oracle, null or chat")


@app.command()
def run(
    task: Annotated[str, typer.Argument(help="org/name[@version]:task_id")],
    policy: Annotated[
        str, typer.Option(help="oracle | null | interactive | script")
    ] = "interactive",
    script: Annotated[
        Path | None, typer.Option(help="JSON lines of actions, for --policy script")
    ] = None,
    url: Url = None,
    token: Token = None,
    data_dir: DataDir = None,
) -> None:
    """Run one episode, scripted or interactively (actions as JSON: {"tool": …, "arguments": …})."""

    async def go() -> None:
        async with open_client(url, token, data_dir) as client:
            await _one_episode(client, task, policy, script)

    _run(go())


async def _one_episode(client: AsyncClient, task: str, policy: str, script: Path | None) -> None:
    options = {"oracle": True} if policy == "oracle" else {}
    reset = await client.reset(task, options=options)
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
            line = console.input("[bold]action>[/bold] ")
            try:
                action = json.loads(line)
            except json.JSONDecodeError:
                err.print('type JSON like {"tool": "submit", "arguments": {}}')
                continue
        try:
            last = await client.step(reset.episode_id, action)
        except PalaestraError as exc:
            err.print(f"[yellow]{exc.code}[/yellow]: {exc.message}")
            if exc.status != 422:
                raise
            continue
        console.print(last.observation.text)
    verdict = await client.verify(reset.episode_id)
    console.print_json(verdict.model_dump_json())
    await client.close(reset.episode_id)


@app.command("eval")
def eval_(
    pack: Annotated[str, typer.Option(help="org/name[@version]")],
    split: Annotated[str, typer.Option(help="split to evaluate")] = "heldout",
    policy: Annotated[str, typer.Option(help="oracle | null | chat")] = "oracle",
    k: Annotated[int, typer.Option("-k", help="attempts per task")] = 1,
    concurrency: Annotated[int, typer.Option(help="episodes at once")] = 4,
    max_steps: Annotated[int, typer.Option(help="steps per attempt")] = 30,
    limit: Annotated[int | None, typer.Option(help="only the first N tasks")] = None,
    base_url: Annotated[str | None, typer.Option(help="chat policy: OpenAI-compatible URL")] = None,
    model: Annotated[str | None, typer.Option(help="chat policy: model name")] = None,
    api_key_env: Annotated[
        str, typer.Option(help="chat policy: env var holding the key")
    ] = "OPENAI_API_KEY",
    out: Annotated[Path | None, typer.Option(help="write the JSON report here")] = None,
    url: Url = None,
    token: Token = None,
    data_dir: DataDir = None,
) -> None:
    """Evaluate a policy on a split: k attempts a task, a table, a JSON report."""
    chosen = make_policy(policy, base_url, model, api_key_env)
    report = _run(
        _evaluate(chosen, pack, split, k, concurrency, max_steps, limit, url, token, data_dir)
    )
    print_report(report)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=1))
        console.print(f"report written to {out}")
    if report["summary"]["attempts"] == 0:
        raise typer.Exit(1)


async def _evaluate(
    policy: Policy,
    pack: str,
    split: str,
    k: int,
    concurrency: int,
    max_steps: int,
    limit: int | None,
    url: str | None,
    token: str | None,
    data_dir: Path | None,
) -> dict[str, Any]:
    async with open_client(url, token, data_dir) as client:
        info = next((p for p in await client.packs() if p.name == pack.split("@")[0]), None)
        if info is None:
            raise PalaestraError(f"the server has no pack {pack!r}", code="not_found")
        listing = await client.tasks(pack=pack, split=split, limit=10000)
        chosen = listing.tasks[:limit] if limit else listing.tasks
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("reward {task.fields[reward]:.3f} void {task.fields[void]}"),
            TimeRemainingColumn(),
            console=err,
        ) as progress:
            bar = progress.add_task(
                f"{policy.name} on {pack} {split}", total=len(chosen) * k, reward=0.0, void=0
            )
            done: list[Attempt] = []

            def tick(attempt: Attempt) -> None:
                done.append(attempt)
                scored = [a.reward for a in done if a.status == "ok"]
                progress.update(
                    bar,
                    advance=1,
                    void=sum(a.status == "void" for a in done),
                    reward=sum(scored) / len(scored) if scored else 0.0,
                )

            attempts = await run_eval(
                client,
                policy,
                chosen,
                k=k,
                concurrency=concurrency,
                max_steps=max_steps,
                on_attempt=tick,
            )
    header = {
        "pack": info.name,
        "version": info.version,
        "pack_digest": info.digest,
        "split": split,
        "policy": policy.name,
        "k": k,
        "seeds": list(range(k)),
        "server": url or "embedded",
        "palaestra_version": palaestra.__version__,
        "max_steps": max_steps,
    }
    return build_report(attempts, k=k, header=header)


def print_report(report: dict[str, Any]) -> None:
    h = report["header"]
    table = Table(
        "domain",
        "tasks",
        "attempts",
        "mean reward",
        "passed",
        "pass@1",
        f"pass@{h['k']}",
        "void",
        "errors",
        title=f"{h['policy']} on {h['pack']}@{h['version']} ({h['split']})",
    )
    rows = [*report["by"]["domain"].items(), ("all", report["summary"])]
    for name, s in rows:
        table.add_row(
            name,
            str(s["tasks"]),
            str(s["attempts"]),
            f"{s['mean_reward']:.3f} ± {s['stderr']:.3f}",
            str(s["passed"]),
            f"{s['pass_at_k'].get('1', 0):.3f}",
            f"{s['pass_at_k'].get(str(h['k']), 0):.3f}",
            str(s["void"]),
            str(s["errors"]),
        )
    console.print(table)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
