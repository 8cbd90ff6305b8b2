"""What the group-reward tests share: an echo family whose episodes can be judged as a group,
the real app served on loopback in the test's own event loop, and tenants' HTTP clients."""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import uvicorn
from judge_fakes import (
    Behaviour,
    FakeJudge,
    HttpJudgeChat,
    Reply,
    by_rule,
    prefer,
    rank_by,
    schema_of,
)

from palaestra.envs.base import EpisodeContext, StepOutcome, Tool, ToolArgs
from palaestra.envs.echo import EchoFamily, EchoPrivate, EchoPublic
from palaestra.sdk.http import AsyncHTTPClient, RetryPolicy
from palaestra.server.app import create_app
from palaestra.server.auth import create_token
from palaestra.server.manager import EpisodeManager
from palaestra.verifiers.judge import Criterion, JudgeConfig, JudgedSubject, Rubric, Subject
from palaestra.verifiers.judge_protocol import JudgeCache, JudgeChat, JudgeUnavailable

JUDGE = "group-judge"  # the endpoint name the family's config names
RUBRIC = Rubric(
    name="echo-reversal",
    criteria=[
        Criterion(
            name="reversal",
            text="Is the answer the word's letters in reverse order?",
            choices=["wrong", "partly", "exact"],
        )
    ],
)
BIRCH = "palaestra/echo:say-birch"  # answer hcrib
COBALT = "palaestra/echo:say-cobalt"
SEALED = "palaestra/echo:say-apple"  # heldout (sealed), answer elppa
LETTERS = "palaestra/letters:next-a"  # a family that cannot be judged as a group
VOID_ANSWER = "crash-the-environment"


class JudgedEcho(EchoFamily):
    """Echo (same name, replaces the built-in) whose ended episodes give a judged subject:
    the instruction, the private answer as the reference, the submitted answer."""

    async def step(self, ctx: EpisodeContext, tool: Tool, args: ToolArgs) -> StepOutcome:
        if getattr(args, "answer", None) == VOID_ANSWER:
            raise RuntimeError("injected environment crash")  # the episode goes void
        return await super().step(ctx, tool, args)

    def judged_subject(self, ctx: EpisodeContext) -> JudgedSubject | None:
        return JudgedSubject(
            rubric=RUBRIC,
            config=JudgeConfig(judge=JUDGE),
            subject=Subject(
                task=EchoPublic.of(ctx.task).instruction,
                reference=EchoPrivate.of(ctx.task).answer,
                candidate=str(ctx.state.answer or ""),
            ),
        )


@asynccontextmanager
async def serve(manager: EpisodeManager) -> AsyncIterator[str]:
    """The real app over `manager` (started and shut down by its lifespan), served by
    uvicorn on a loopback port in this event loop: its base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        create_app(manager.settings, manager=manager), log_level="warning", lifespan="on"
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        assert not task.done(), "the server did not start"
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
        sock.close()


def client_of(manager: EpisodeManager, url: str, scopes: list[str]) -> AsyncHTTPClient:
    """An HTTP client with a new token of `scopes`."""
    token, _ = create_token(manager.store.db, scopes, name=f"t-{uuid.uuid4().hex[:8]}")
    return AsyncHTTPClient(url, token=token, retry=RetryPolicy(attempts=1))


async def ended(client: Any, task: str, answer: str) -> str:
    """An episode of `task` that submitted `answer` (verified, ended): its id."""
    started = await client.reset(task)
    reply = await client.step(
        started.episode_id, {"tool": "submit", "arguments": {"answer": answer}}
    )
    assert reply.terminated, reply
    return str(started.episode_id)


class DownJudge:
    """A judge endpoint that is down: every call raises JudgeUnavailable (a named fake)."""

    name = JUDGE
    model = "down"

    def __init__(self, reason: str = "connection refused") -> None:
        self.reason = reason
        self.calls = 0

    async def complete(self, messages: Any, sampling: Any, *, schema: Any = None) -> str:
        self.calls += 1
        raise JudgeUnavailable(self.name, self.reason)


class Judges:
    """The server's judges for these tests: one endpoint, swappable (`chat`)."""

    def __init__(self, chat: JudgeChat) -> None:
        self.chat = chat

    def get(self, name: str) -> JudgeChat:
        if name != JUDGE:
            raise JudgeUnavailable(name, "no judge endpoint of that name is configured")
        return self.chat

    @property
    def cache(self) -> JudgeCache | None:
        return None


def judging(quality: Mapping[str, float]) -> Behaviour:
    """FakeJudge's behaviour for these tests: grades every candidate by `quality[text]` in
    whichever mode it is asked (rubric, pairwise, ranking), read from the reply schema."""
    top = max(quality.values())

    def key(text: str) -> float:
        return quality.get(text, 0.0) / top

    pair, rank = prefer(key), rank_by(lambda text: 10 * key(text))
    rubric = by_rule(lambda _name, choices, text: round(key(text) * (len(choices) - 1)))

    def answer(body: dict[str, Any]) -> Reply:
        properties = schema_of(body)["properties"]
        if "winner" in properties:
            return pair(body)
        return rank(body) if "candidates" in properties else rubric(body)

    return answer


@contextmanager
def judge_server(quality: Mapping[str, float]) -> Iterator[tuple[FakeJudge, HttpJudgeChat]]:
    """FakeJudge (tests/judge_fakes.py: a scripted OpenAI chat server on loopback) grading by
    `quality`, and the endpoint `JUDGE` over it."""
    fake = FakeJudge()
    fake.script(default=judging(quality))
    with fake.serve() as url:
        yield fake, HttpJudgeChat(url, name=JUDGE)
