"""`palaestra conformance URL`: a session contract run against a live server of any of the
protocols palaestra speaks (its own `/v1`, OpenEnv, ORS, NeMo Gym), palaestra's or not.

Trainers retry: a lost reply is resent, a seed repeated, a close sent twice or for a session
that was never seen. Each check drives one such case and says pass, fail, or not-applicable
(the protocol has no such operation) with the reason; any fail exits 1. A 5xx is always a
fail: an answer to a client's case is never a server error.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Annotated, Any

import httpx
import typer
from rich.table import Table
from rich.text import Text

from palaestra.cli.conformance_drivers import DRIVERS, PROTOCOLS, Driver, Reply
from palaestra.cli.console import console, error

PASS, FAIL, NA = "pass", "fail", "n/a"
SEED = 7
DEFAULT_TASK = "palaestra/echo:say-birch"
MAX_REPLY_BYTES = 16 << 20  # a reply past this is the server's fail, not this process's memory
CHECK_DEADLINE_S = 120.0  # a check (a few calls) that takes longer fails: a drip-fed stream


class _CappedStream(httpx.AsyncByteStream):
    def __init__(self, inner: httpx.AsyncByteStream, limit: int) -> None:
        self.inner, self.limit = inner, limit

    async def __aiter__(self) -> AsyncIterator[bytes]:
        seen = 0
        async for chunk in self.inner:
            seen += len(chunk)
            if seen > self.limit:
                raise httpx.ReadError(f"a reply larger than {self.limit} bytes")
            yield chunk

    async def aclose(self) -> None:
        await self.inner.aclose()


class CappedTransport(httpx.AsyncBaseTransport):
    """httpx's transport with every reply body cut off (an error) past `limit` bytes."""

    def __init__(self, limit: int = MAX_REPLY_BYTES) -> None:
        self.inner = httpx.AsyncHTTPTransport(limits=httpx.Limits(max_keepalive_connections=0))
        self.limit = limit

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        got = await self.inner.handle_async_request(request)
        assert isinstance(got.stream, httpx.AsyncByteStream)
        return httpx.Response(
            got.status_code,
            headers=got.headers,
            stream=_CappedStream(got.stream, self.limit),
            extensions=got.extensions,
        )

    async def aclose(self) -> None:
        await self.inner.aclose()


@dataclass(frozen=True)
class Result:
    check: str
    result: str
    reason: str


Check = Callable[[Driver], Awaitable[tuple[str, str]]]


def refused(reply: Reply, *statuses: int) -> bool:
    return reply.status in statuses


def server_error(reply: Reply, what: str) -> tuple[str, str] | None:
    if reply.status >= 500:
        return FAIL, f"{what} answered {reply.brief()}: a server error, not a client one"
    return None


async def opened(driver: Driver, seed: int | None = None) -> str:
    got = await driver.open(seed)
    if got.sid is None:
        raise Unrunnable(f"could not open a session: {got.reply.brief()}")
    return got.sid


class Unrunnable(Exception):
    """The check could not set up its case (a fail: the server refused a plain session)."""


async def seed_repeat(driver: Driver) -> tuple[str, str]:
    if "seed" not in driver.has:
        a, b = await driver.open(), await driver.open()
        if not (a.reply.ok and b.reply.ok):
            return FAIL, f"open answered {a.reply.brief()} / {b.reply.brief()}"
        if a.observation != b.observation:
            return FAIL, "two sessions of the same task opened on different prompts"
        return PASS, "no seeds: two sessions of one task open on the same prompt"
    if isinstance(driver, _nemo()):  # its seed is a caller-named session, not a draw
        a = await driver.open(SEED)
        b = await driver.open(SEED, sid=a.sid) if a.sid else a
        if not (a.reply.ok and b.reply.ok):
            return FAIL, f"seed, repeated seed answered {a.reply.brief()} / {b.reply.brief()}"
        if a.sid != b.sid:
            return FAIL, f"a repeated seed named another session ({a.sid} / {b.sid})"
        return PASS, "a repeated seed (same id and episode) returns the same session"
    a, b = await driver.open(SEED), await driver.open(SEED)
    if not (a.reply.ok and b.reply.ok):
        return FAIL, f"reset answered {a.reply.brief()} / {b.reply.brief()}"
    if a.observation != b.observation:
        return FAIL, f"seed {SEED} twice gave two first observations"
    return PASS, f"seed {SEED} twice: the same first observation"


def _nemo() -> type[Driver]:
    return DRIVERS["nemo-gym"]


async def seed_conflict(driver: Driver) -> tuple[str, str]:
    sid = f"conformance-{uuid.uuid4().hex[:12]}"
    first = await driver.open(SEED, sid=sid)
    if not first.reply.ok:
        return FAIL, f"a session under a chosen id could not open: {first.reply.brief()}"
    if first.sid != sid:
        return NA, "the server assigns its own session ids (a client cannot name one twice)"
    second = await driver.open(SEED + 1, sid=sid, conflict=True)
    if (bad := server_error(second.reply, "a conflicting seed")) is not None:
        return bad
    if second.reply.ok:
        return FAIL, f"a second, different session under id {sid!r} was accepted"
    return PASS, f"a conflicting seed of {sid!r} is refused ({second.reply.status})"


async def close_repeat(driver: Driver) -> tuple[str, str]:
    if "close" not in driver.has:
        return NA, "the protocol has no close over HTTP"
    sid = await opened(driver)
    first, second = await driver.close(sid), await driver.close(sid)
    if not first.ok:
        return FAIL, f"close answered {first.brief()}"
    if (bad := server_error(second, "a repeated close")) is not None:
        return bad
    if second.ok or refused(second, 404, 409, 410):
        how = "idempotent" if second.ok else f"a clear {second.status}"
        return PASS, f"a repeated close is {how}"
    return FAIL, f"a repeated close answered {second.brief()}"


async def close_foreign(driver: Driver, other: str | None) -> tuple[str, str]:
    if "close" not in driver.has:
        return NA, "the protocol has no close over HTTP"
    sid = await opened(driver)
    # NeMo Gym's contract: a close of an id never seeded succeeds (and bars a later seed);
    # ORS's reference server deletes idempotently. A 2xx there is a no-op, if ours lives on.
    noop_ok = isinstance(driver, (_nemo(), DRIVERS["ors"]))
    cases = [("a session id never issued", driver, f"{sid}-foreign")]
    if other:
        cases.append(("another token", driver.as_other(other), sid))
    for who, closer, target in cases:
        got = await closer.close(target)
        if (bad := server_error(got, f"close by {who}")) is not None:
            return bad
        if not (refused(got, 404) or (noop_ok and got.ok)):
            return FAIL, f"close by {who} answered {got.brief()}, not not-found"
    still = await driver.act(sid)
    if not still.ok:
        return FAIL, f"the session was hurt by a foreign close: {still.brief()}"
    await driver.close(sid)
    whom = "an unknown id" + (" and another token" if other else " (no --other-token)")
    how = "not found or a no-op" if noop_ok else "not found"
    return PASS, f"a close naming {whom} is {how}; the session lives on"


async def lost_reply(driver: Driver) -> tuple[str, str]:
    if "request_id" not in driver.has:
        return NA, "the protocol has no request ids: a resent call cannot be told apart"
    sid = await opened(driver)
    rid = uuid.uuid4().hex
    first, again = await driver.act(sid, request_id=rid), await driver.act(sid, request_id=rid)
    if (bad := server_error(again, "a resent step")) is not None:
        return bad
    if not (first.ok and again.ok) or first.body != again.body:
        return FAIL, f"a resent step answered {again.brief()}, not the first reply"
    count = await driver.steps(sid)
    await driver.close(sid)
    if count is not None and count != 1:
        return FAIL, f"a step resent with its request id ran twice ({count} steps)"
    return PASS, "a resent step returns the first reply" + (", one step ran" if count else "")


async def replay(driver: Driver) -> tuple[str, str]:
    if "request_id" not in driver.has:
        return NA, "the protocol has no request ids"
    sid = await opened(driver)
    rid = uuid.uuid4().hex
    first = await driver.act(sid, request_id=rid)
    await driver.act(sid, request_id=uuid.uuid4().hex)
    changed = {k: f"{v}-changed" if isinstance(v, str) else v for k, v in driver.arguments.items()}
    later = await driver.act(sid, arguments=changed, request_id=rid)
    await driver.close(sid)
    if (bad := server_error(later, "a replayed request id")) is not None:
        return bad
    if later.ok and later.body == first.body:
        return PASS, "an earlier request id replays its stored reply (the new body unused)"
    if refused(later, 409, 422):
        return PASS, f"an earlier request id with another body is refused ({later.status})"
    return FAIL, f"an earlier request id answered {later.brief()}, not its stored reply"


async def verify_after_close(driver: Driver) -> tuple[str, str]:
    if "verify" not in driver.has:
        return NA, "the protocol has no verify: the reward arrives with the last call"
    sid = await opened(driver)
    await driver.act(sid)
    before = await driver.verify(sid)
    await driver.close(sid)
    after = await driver.verify(sid)
    if (bad := server_error(after, "verify after close")) is not None:
        return bad
    if not before.ok:
        return FAIL, f"verify answered {before.brief()}"
    reward = before.body.get("reward") if isinstance(before.body, dict) else None
    if after.ok and isinstance(after.body, dict) and after.body.get("reward") == reward:
        return PASS, f"verify after close returns the stored verdict (reward {reward})"
    if refused(after, 404, 409, 410):
        return PASS, f"verify after close is a clear {after.status}"
    return FAIL, f"verify after close answered {after.brief()} (before: reward {reward})"


async def unknown_session(driver: Driver) -> tuple[str, str]:
    ghost = f"conformance-ghost-{uuid.uuid4().hex[:12]}"
    got = await (driver.verify(ghost) if "verify" in driver.has else driver.act(ghost))
    if (bad := server_error(got, "a call on an unknown session")) is not None:
        return bad
    if 400 <= got.status < 500:
        return PASS, f"a call on an unknown session is {got.status}"
    if got.ok and isinstance(driver, _nemo()):
        return NA, "verify scores the request body alone (NeMo Gym lets a server keep no state)"
    return FAIL, f"a call on an unknown session answered {got.brief()}"


async def run_checks(
    driver: Driver, other: str | None = None, deadline_s: float = CHECK_DEADLINE_S
) -> list[Result]:
    checks: list[tuple[str, Check]] = [
        ("repeated seed", seed_repeat),
        ("conflicting seed", seed_conflict),
        ("repeated close", close_repeat),
        ("foreign close", lambda d: close_foreign(d, other)),
        ("lost reply", lost_reply),
        ("replay by request id", replay),
        ("verify after close", verify_after_close),
        ("unknown session", unknown_session),
    ]
    results = []
    for name, check in checks:
        try:
            result, reason = await asyncio.wait_for(check(driver), deadline_s)
        except Unrunnable as exc:
            result, reason = FAIL, str(exc)
        except TimeoutError:
            result, reason = FAIL, f"no answer within {deadline_s:g} s"
        except Exception as exc:  # a hostile server's reply of any shape is its fail, not ours
            result, reason = FAIL, f"{type(exc).__name__}: {exc}"[:300]
        results.append(Result(name, result, reason))
    return results


async def conform(
    url: str,
    protocol: str,
    *,
    task: str = DEFAULT_TASK,
    tool: str = "echo",
    arguments: dict[str, Any] | None = None,
    token: str | None = None,
    other_token: str | None = None,
    deadline_s: float = CHECK_DEADLINE_S,
) -> list[Result]:
    """The checks' results for the server at `url` (for OpenEnv, the environment's base,
    e.g. `…/openenv/palaestra/echo`). Each check has `deadline_s`, each reply at most
    MAX_REPLY_BYTES; redirects are not followed (the token goes to `url` alone)."""
    # A fresh connection per call: a server that drops one after an error costs that call only.
    transport = CappedTransport()
    timeout = min(60.0, deadline_s)
    async with httpx.AsyncClient(base_url=url, timeout=timeout, transport=transport) as http:
        driver = DRIVERS[protocol](http, task, tool, arguments or {"text": "conformance"}, token)
        return await run_checks(driver, other_token, deadline_s)


def conformance(
    url: Annotated[str, typer.Argument(help="the server (OpenEnv: the environment's base URL)")],
    protocol: Annotated[
        str, typer.Option(help="palaestra, openenv, ors or nemo-gym")
    ] = "palaestra",
    token: Annotated[str | None, typer.Option(help="bearer token, if the server wants one")] = None,
    other_token: Annotated[
        str | None, typer.Option(help="a second token: its close of our session must miss")
    ] = None,
    task: Annotated[
        str, typer.Option(help="the task sessions open on ('' sends none: the server picks)")
    ] = DEFAULT_TASK,
    tool: Annotated[str, typer.Option(help="the tool a step calls")] = "echo",
    arguments: Annotated[
        str, typer.Option(help="that tool's arguments (JSON object)")
    ] = '{"text": "conformance"}',
    as_json: Annotated[bool, typer.Option("--json", help="print the results as JSON")] = False,
) -> None:
    """Run the session contract (repeated and conflicting seeds, repeated and foreign closes,
    lost replies, replay by request id, verify after close) against URL; exit 1 on a fail."""
    if protocol not in PROTOCOLS:
        error(f"--protocol is one of {', '.join(PROTOCOLS)}, not {protocol!r}")
        raise typer.Exit(2)
    try:
        args = json.loads(arguments)
    except ValueError:
        args = None
    if not isinstance(args, dict):
        error("--arguments must be a JSON object")
        raise typer.Exit(2)
    results = asyncio.run(
        conform(
            url,
            protocol,
            task=task,
            tool=tool,
            arguments=args,
            token=token,
            other_token=other_token,
        )
    )
    if as_json:
        console.print_json(json.dumps([asdict(r) for r in results]))
    else:
        table = Table(title=f"{protocol} session contract: {url}")
        for column in ("check", "result", "reason"):
            table.add_column(column)
        style = {PASS: "green", FAIL: "red", NA: "dim"}
        for r in results:
            table.add_row(r.check, Text(r.result, style=style[r.result]), r.reason)
        console.print(table)
    if any(r.result == FAIL for r in results):
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("conformance")(conformance)
