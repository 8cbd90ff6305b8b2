"""The `echo` family: the smallest complete family, with no sandbox.

`echo` returns its text (the no-op step the API benchmark drives), after the task's
`delay_ms` (a step that waits on I/O, for bench/scale.py); `submit` ends the episode and the
verifier compares the answer with the private one, exactly.
"""

from __future__ import annotations

import asyncio
import re

from pydantic import Field

from palaestra.envs.base import (
    Assessment,
    EpisodeContext,
    Family,
    PrivateFields,
    PublicFields,
    StepOutcome,
    Tool,
    ToolArgs,
)
from palaestra.sdk.models import Action, Observation, VerifierInfo
from palaestra.sdk.task import Task


class EchoArgs(ToolArgs):
    text: str = Field(default="", max_length=100_000)


class SubmitArgs(ToolArgs):
    answer: str = Field(default="", max_length=100_000)


class EchoPublic(PublicFields):
    instruction: str = ""
    delay_ms: int = Field(default=0, ge=0, le=10_000, description="wait before each echo")


class EchoPrivate(PrivateFields):
    answer: str


class EchoFamily(Family):
    name = "echo"
    description = "Echo text back; submit an exact answer. For API benchmarks and as an example."
    version = "0.1.0"
    tools = (
        Tool("echo", "Return the given text unchanged.", EchoArgs),
        Tool("submit", "End the episode with an answer.", SubmitArgs),
    )
    public_fields = EchoPublic
    private_fields = EchoPrivate

    async def reset(self, ctx: EpisodeContext) -> Observation:
        return Observation(text=EchoPublic.of(ctx.task).instruction)

    async def step(self, ctx: EpisodeContext, tool: Tool, args: ToolArgs) -> StepOutcome:
        if isinstance(args, SubmitArgs):
            ctx.state["answer"] = args.answer
            return StepOutcome(Observation(text="submitted"), done=True)
        assert isinstance(args, EchoArgs)
        if "delay_ms" in ctx.task.public:  # the no-op step skips validating the fields
            await asyncio.sleep(EchoPublic.of(ctx.task).delay_ms / 1000)
        return StepOutcome(Observation(text=args.text))

    def verifier_info(self) -> VerifierInfo:
        return VerifierInfo(name="exact-match", version="1.0.0")

    async def verify(self, ctx: EpisodeContext) -> Assessment:
        answer = ctx.state.get("answer")
        correct = answer is not None and answer.strip() == EchoPrivate.of(ctx.task).answer.strip()
        return Assessment(
            reward=1.0 if correct else 0.0,
            passed=correct,
            components={"exact_match": 1.0 if correct else 0.0},
            feedback="correct" if correct else "incorrect" if answer is not None else "no answer",
        )

    def oracle(self, task: Task) -> list[Action]:
        return [Action(tool="submit", arguments={"answer": EchoPrivate.of(task).answer})]

    def cheats(self, task: Task) -> list[tuple[str, list[Action]]]:
        instruction = EchoPublic.of(task).instruction
        quoted = re.findall(r"'([^']*)'", instruction)
        cheats = [
            ("submit-instruction", [Action(tool="submit", arguments={"answer": instruction})]),
            ("empty-answer", [Action(tool="submit", arguments={"answer": ""})]),
        ]
        if quoted:  # the word the instruction quotes, not transformed as asked
            cheats.append(("copy-quoted", [Action(tool="submit", arguments={"answer": quoted[0]})]))
        return cheats
