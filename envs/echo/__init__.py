"""The `echo` family: the smallest complete family, with no sandbox.

`echo` returns its text (the no-op step the API benchmark drives), after the task's
`delay_ms` (a step that waits on I/O, for bench/scale.py); `submit` ends the episode and the
verifier compares the answer with the private one, exactly.
"""

from __future__ import annotations

import asyncio
import re

from pydantic import Field

from palaestra.envs import (
    Action,
    Assessment,
    EpisodeContext,
    Family,
    Observation,
    PrivateFields,
    PublicFields,
    State,
    StepOutcome,
    Task,
    ToolArgs,
    VerifierInfo,
    tool,
)


class EchoArgs(ToolArgs):
    text: str = Field(default="", max_length=100_000)


class SubmitArgs(ToolArgs):
    answer: str = Field(default="", max_length=100_000)


class EchoPublic(PublicFields):
    instruction: str = ""
    delay_ms: int = Field(default=0, ge=0, le=10_000, description="wait before each echo")


class EchoPrivate(PrivateFields):
    answer: str


class EchoState(State):
    answer: str | None = None  # what `submit` was given


Ctx = EpisodeContext[EchoState]


class EchoFamily(Family[EchoState]):
    name = "echo"
    description = "Echo text back; submit an exact answer. For API benchmarks and as an example."
    version = "0.1.0"
    public_fields = EchoPublic
    private_fields = EchoPrivate

    async def reset(self, ctx: Ctx) -> Observation:
        return Observation(text=EchoPublic.of(ctx.task).instruction)

    @tool("Return the given text unchanged.")
    async def echo(self, ctx: Ctx, args: EchoArgs) -> StepOutcome:
        delay_ms = EchoPublic.of(ctx.task).delay_ms  # validated at load: a lookup
        if delay_ms:
            await asyncio.sleep(delay_ms / 1000)
        return StepOutcome(Observation(text=args.text))

    @tool("End the episode with an answer.")
    async def submit(self, ctx: Ctx, args: SubmitArgs) -> StepOutcome:
        ctx.state.answer = args.answer
        return StepOutcome(Observation(text="submitted"), done=True)

    def verifier_info(self) -> VerifierInfo:
        return VerifierInfo(name="exact-match", version="1.0.0")

    async def verify(self, ctx: Ctx) -> Assessment:
        answer = ctx.state.answer
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
