"""`palaestra export atif` and `palaestra import atif`: episodes and eval runs as ATIF
trajectories (sdk/atif.py; docs/integrations.md, "ATIF").

    palaestra export atif EPISODE_ID [-o FILE] [--atif-version 1.8|1.7] [--url URL --token T]
    palaestra export atif --run RUN_DIR -o DIR      # one file per attempt of the run
    palaestra export atif --run RUN_DIR --episodes -o DIR   # each attempt's whole episode
    palaestra import atif FILE [-o OUT]             # an episode's JSON (GET /v1/episodes/{id})
    palaestra import atif DIR -o RUN_DIR            # an exported run: a run directory again
                                                    # (episode files: a folder of their JSONs)

An import lands where our tools read it, not in a server's store (docs/decisions.md): an
episode as the JSON `GET /v1/episodes/{id}` answers, a run as a run directory. A file that
is not valid ATIF is refused with each problem's step and field, exit 2, nothing written.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer

from palaestra.cli.clients import open_client
from palaestra.cli.console import console, err, error, styled
from palaestra.cli.options import DataDir, Token, Url
from palaestra.sdk.atif import (
    atif_to_attempt,
    atif_to_episode,
    attempt_to_atif,
    episode_to_atif,
    kind_of,
)
from palaestra.sdk.atif_models import VERSIONS, AtifError
from palaestra.sdk.errors import PalaestraError
from palaestra.sdk.evaluation.attempt import Attempt
from palaestra.sdk.evaluation.rundir import RunDir, RunError
from palaestra.sdk.models import EpisodeState

export_app = typer.Typer(
    help="Write episodes and eval runs in another format.", no_args_is_help=True
)
import_app = typer.Typer(
    help="Read episodes and eval runs written in another format.", no_args_is_help=True
)

VersionOpt = Annotated[
    str, typer.Option("--atif-version", help="the ATIF version to write: 1.8 or 1.7")
]
SUFFIX = ".atif.json"
Server = tuple[str | None, str | None, Path | None]  # --url, --token, --data-dir


def _version(value: str) -> str:
    wanted = value if value.startswith("ATIF-") else f"ATIF-v{value.removeprefix('v')}"
    if wanted not in VERSIONS:
        raise _fail(f"--atif-version {value!r}: write one of 1.8, 1.7")
    return wanted


def _fail(message: str, code: int = 2) -> typer.Exit:
    error(message)
    return typer.Exit(code)


def _dump(document: Any) -> str:
    return json.dumps(document, indent=1, ensure_ascii=False) + "\n"


def _write(path: Path, text: str) -> None:
    """Whole or not at all: a temporary file beside `path`, renamed over it."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    except OSError as exc:
        raise _fail(f"{path}: cannot write there: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise _fail(f"{path}: cannot write there: {exc.strerror or exc}") from None
        raise


def _staging(out: Path) -> Path:
    """A new folder beside `out`, renamed to it once whole."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent.resolve()))
    except OSError as exc:
        raise _fail(f"{out}: cannot write there: {exc.strerror or exc}") from None


@export_app.command("atif")
def export_atif(
    episode: Annotated[str | None, typer.Argument(help="the episode id")] = None,
    run: Annotated[
        Path | None, typer.Option("--run", help="an eval run directory: one file per attempt")
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option("-o", "--out", help="the file (a run: the directory) to write; else stdout"),
    ] = None,
    episodes: Annotated[
        bool,
        typer.Option(
            "--episodes",
            help="with --run: each attempt's whole episode as the server stored it (every "
            "record, observations uncut) instead of the run's own record of it",
        ),
    ] = False,
    version: VersionOpt = "1.8",
    url: Url = None,
    token: Token = None,
    data_dir: DataDir = None,
) -> None:
    """Write an episode (read from the server: live or stored), or every attempt of an
    eval run directory, as ATIF trajectories; the steps keep every record, token ids and
    logprobs of harness model calls included."""
    wanted = _version(version)
    if (episode is None) == (run is None):
        raise _fail("name an EPISODE_ID or --run RUN_DIR (one of them)")
    if run is not None:
        if out is None:
            raise _fail("--run writes one file per attempt: give the directory with -o DIR")
        server = (url, token, data_dir) if episodes else None
        _export_run(run, out, wanted, server)
        return
    assert episode is not None
    try:
        (state,) = asyncio.run(_states([episode], (url, token, data_dir)))
    except PalaestraError as exc:
        raise _fail(f"episode {episode}: {exc.message}", 1) from None
    text = _dump(episode_to_atif(state, wanted))
    if out is None:
        print(text, end="")
        return
    _write(out, text)
    err.print(f"{len(state.trajectory)} steps of episode {episode} → {out} ({wanted})")


async def _states(ids: list[str], server: Server) -> list[EpisodeState]:
    async with open_client(*server, read_only=True) as client:
        return [await client.state(episode) for episode in ids]


def _export_run(run: Path, out: Path, version: str, server: Server | None) -> None:
    """One file per line of the run's attempts.jsonl: the run's record of the attempt, or
    (`server`) the episode it played, as that server keeps it."""
    try:
        store = RunDir.open(run)
        manifest, attempts = store.manifest(), store.records()
    except RunError as exc:
        raise _fail(str(exc)) from None
    except TypeError as exc:  # a line missing an attempt's fields
        raise _fail(f"{run}: a line of its attempts.jsonl is no attempt ({exc})") from None
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise _fail(f"{out} exists and is not an empty directory")
    if server is None:
        documents = [
            (_name(i, a), attempt_to_atif(a.to_json(), manifest, i, version))
            for i, a in enumerate(attempts)
        ]
    else:
        played = [(i, a) for i, a in enumerate(attempts) if a.episode_id]
        for i, a in enumerate(attempts):
            if not a.episode_id:
                err.print(styled("skipped", "yellow", f" {_name(i, a)}: no episode ({a.error})"))
        try:
            states = asyncio.run(_states([a.episode_id for _, a in played], server))
        except PalaestraError as exc:
            raise _fail(f"the run's episodes: {exc.message}", 1) from None
        documents = [
            (_name(i, a), episode_to_atif(state, version))
            for (i, a), state in zip(played, states, strict=True)
        ]
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _fail(f"{out}: cannot write there: {exc.strerror or exc}") from None
    for name, document in documents:
        _write(out / name, _dump(document))
    err.print(f"{len(documents)} attempts of {run} → {out}/ ({version}, one file each)")


def _slug(text: str, size: int) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.")[:size]


def _name(line: int, attempt: Attempt) -> str:
    """The attempt's file name: its task and number, nothing else of a hostile run's
    attempts.jsonl (an `attempt` of "/../../x" wrote outside -o DIR)."""
    number = attempt.attempt
    shown = str(number) if type(number) is int else _slug(str(number), 20)
    return f"{line:05d}-{_slug(str(attempt.task), 80)}-a{shown}{SUFFIX}"


def _attempt_problems(attempt: dict[str, Any]) -> list[str]:
    """What an imported attempt lacks to be a line of a run's attempts.jsonl."""
    where = "extra.palaestra.attempt"
    problems = [
        f"{where}.{f.name}: Field required"
        for f in dataclasses.fields(Attempt)
        if f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
        and f.name not in attempt
    ]
    for name, kind in (("attempt", int), ("seed", int), ("task", str), ("episode_id", str)):
        value = attempt.get(name)
        if name in attempt and (type(value) is not kind):
            problems.append(f"{where}.{name}: must be {'an integer' if kind is int else 'text'}")
    return problems


@import_app.command("atif")
def import_atif(
    source: Annotated[Path, typer.Argument(help="an ATIF file, or a directory of them (a run)")],
    out: Annotated[
        Path | None,
        typer.Option("-o", "--out", help="where to write (a run: the run directory); else stdout"),
    ] = None,
) -> None:
    """Check an ATIF trajectory (v1.7 or v1.8) and read it back: an episode (ours, exactly;
    another producer's, by ATIF's slots) as the JSON of `GET /v1/episodes/{id}`; an
    exported eval run's directory as a run directory `palaestra eval report` reads (a
    directory of episode files: a directory of their JSONs).
    Refused, naming the file, step and field, when it is not valid (exit 2)."""
    if source.is_dir():
        _import_run(source, out)
        return
    document = _read(source)
    try:
        if kind_of(document) == "eval_attempt":
            attempt, _, _ = atif_to_attempt(document)
            text = json.dumps(attempt, ensure_ascii=False) + "\n"
            what = f"attempt {attempt.get('attempt')} of {attempt.get('task')}"
        else:
            state = atif_to_episode(document)
            text = state.model_dump_json(indent=1) + "\n"
            what = f"episode {state.episode_id} ({len(state.trajectory)} steps)"
    except AtifError as exc:
        raise _refuse(source, exc) from None
    if out is None:
        print(text, end="")
        return
    _write(out, text)
    err.print(f"{source}: {what} → {out}")


MAX_FILE_BYTES = 1 << 30  # an ATIF file read whole: past this it is refused, not read


def _read(path: Path, *, in_dir: bool = False) -> Any:
    """The file's JSON: a regular file (in a directory, not a link), at most MAX_FILE_BYTES;
    a FIFO, a device or a link to one would block or never end."""
    try:
        if in_dir and path.is_symlink():
            raise _fail(f"{path}: a symbolic link; a run directory's files are read as files")
        if not path.is_file():
            raise _fail(f"{path}: not a regular file")
        with path.open("rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
        if len(raw) > MAX_FILE_BYTES:
            raise _fail(f"{path}: larger than {MAX_FILE_BYTES} bytes")
        return json.loads(raw)
    except OSError as exc:
        raise _fail(f"{path}: {exc.strerror or exc}") from None
    except ValueError as exc:  # not JSON, not UTF-8, or an integer of too many digits
        raise _fail(f"{path}: not JSON: {exc}") from None
    except RecursionError:
        raise _fail(f"{path}: not JSON palaestra reads: nested too deep") from None


def _refuse(path: Path, exc: AtifError) -> typer.Exit:
    n = len(exc.problems)
    error(f"{path} is not valid ATIF ({n} problem{'s' * (n != 1)}); nothing written", "invalid")
    for problem in exc.problems:
        err.print(styled("  ", "", problem))
    return typer.Exit(2)


def _import_run(source: Path, out: Path | None) -> None:
    if out is None:
        raise _fail("a directory imports as a directory (a run's: a run directory): give -o DIR")
    if out.exists():
        raise _fail(f"{out} exists; a directory is imported into a new one")
    files = sorted(source.glob("*.json"))
    if not files:
        raise _fail(f"{source} holds no .json files")
    documents = [(path, _read(path, in_dir=True)) for path in files]
    try:
        kinds = {_kind(path, document) for path, document in documents}
    except _Refused as refused:
        raise _refuse(refused.path, refused.error) from None
    if kinds != {"eval_attempt"}:
        _import_episodes(documents, out)
        return
    lines: list[tuple[int, dict[str, Any]]] = []
    manifest: dict[str, Any] | None = None
    for path, document in documents:
        try:
            attempt, run, line = atif_to_attempt(document)
            if problems := _attempt_problems(attempt):
                raise AtifError(problems)
        except AtifError as exc:
            raise _refuse(path, exc) from None
        if manifest is not None and run != manifest:
            raise _fail(f"{path}: from another run than {files[0].name} (its manifest differs)")
        manifest = run
        lines.append((line, attempt))
    assert manifest is not None
    staging = _staging(out)
    try:
        store = RunDir.create(staging / "run", manifest)
        for _, attempt in sorted(lines, key=lambda item: item[0]):
            store.append(Attempt.from_json(attempt))
        os.replace(staging / "run", out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    console.print(f"{len(lines)} attempts of run {manifest.get('run_id', '?')} → {out}/")


class _Refused(Exception):
    def __init__(self, path: Path, error: AtifError) -> None:
        self.path, self.error = path, error


def _kind(path: Path, document: Any) -> str:
    try:
        return kind_of(document)
    except AtifError as exc:
        raise _Refused(path, exc) from None


def _import_episodes(documents: list[tuple[Path, Any]], out: Path) -> None:
    """A directory of episode files (`export atif --run … --episodes`, or any ATIF): a
    directory of episode JSONs, each named as its file; all checked before one is written."""
    states = []
    for path, document in documents:
        try:
            states.append((path, atif_to_episode(document)))
        except AtifError as exc:
            raise _refuse(path, exc) from None
    staging = _staging(out)
    try:
        (staging / "out").mkdir()
        for path, state in states:
            name = path.name.removesuffix(".json").removesuffix(".atif") + ".json"
            (staging / "out" / name).write_text(state.model_dump_json(indent=1) + "\n")
        os.replace(staging / "out", out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    console.print(f"{len(states)} episodes → {out}/")
