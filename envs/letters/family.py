"""The letters family (see the package docstring)."""

from __future__ import annotations

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
from palaestra.envs.cheatlib import CheatSurface
from palaestra.sdk.errors import InvalidActionError
from palaestra.sdk.models import Action, Observation, VerifierInfo
from palaestra.sdk.task import Task

DEFAULT_ATTEMPTS = 3


class GuessArgs(ToolArgs):
    letter: str = Field(max_length=8, description="one letter of the task's alphabet")


class SubmitArgs(ToolArgs):
    answer: str = Field(default="", max_length=8, description="the final answer")


class LettersPublic(PublicFields):
    alphabet: str
    letter: str
    shift: int
    attempts: int = DEFAULT_ATTEMPTS


class LettersPrivate(PrivateFields):
    answer: str


class LettersFamily(Family):
    name = "letters"
    description = (
        "Name the letter `shift` places after a given one (cyclic); wrong guesses get a "
        "hint, later or earlier. For training demos: a tiny model learns it on a CPU."
    )
    version = "0.1.0"
    tools = (
        Tool(
            "guess",
            "Guess the letter. Right: the episode ends. Wrong: a hint says whether the "
            "answer comes later or earlier in the alphabet, while attempts remain.",
            GuessArgs,
        ),
        Tool("submit", "End the episode with a final answer.", SubmitArgs),
    )
    public_fields = LettersPublic
    private_fields = LettersPrivate

    async def reset(self, ctx: EpisodeContext) -> Observation:
        fields = LettersPublic.of(ctx.task)
        alphabet, letter, shift, attempts = (
            fields.alphabet,
            fields.letter,
            fields.shift,
            fields.attempts,
        )
        ctx.state.update(attempts=0, solved_at=None)
        text = (
            f"Which letter comes {shift} after {letter!r} in {alphabet!r} (wrapping around)? "
            f"You have {attempts} attempts; each wrong guess gets a hint."
        )
        data = {"letter": letter, "shift": shift, "alphabet": alphabet, "attempts": attempts}
        return Observation(text=text, data=data)

    async def step(self, ctx: EpisodeContext, tool: Tool, args: ToolArgs) -> StepOutcome:
        fields = LettersPublic.of(ctx.task)
        alphabet, attempts = fields.alphabet, fields.attempts
        answer = LettersPrivate.of(ctx.task).answer
        if isinstance(args, SubmitArgs):
            ctx.state["attempts"] += 1
            if args.answer.strip() == answer:
                ctx.state["solved_at"] = ctx.state["attempts"]
            return StepOutcome(Observation(text="submitted"), done=True)
        assert isinstance(args, GuessArgs)
        guess = args.letter.strip()
        if len(guess) != 1 or guess not in alphabet:
            raise InvalidActionError(
                f"a guess is one letter of {alphabet!r}; got {args.letter!r}",
                code="invalid_guess",
            )
        ctx.state["attempts"] += 1
        if guess == answer:
            ctx.state["solved_at"] = ctx.state["attempts"]
            return StepOutcome(Observation(text="right", data={"hint": "right"}), done=True)
        left = attempts - ctx.state["attempts"]
        hint = "later" if alphabet.index(answer) > alphabet.index(guess) else "earlier"
        data = {"hint": hint, "attempts_left": left}
        if left <= 0:
            return StepOutcome(Observation(text="wrong; no attempts left", data=data), done=True)
        return StepOutcome(Observation(text=f"wrong; {hint} ({left} left)", data=data))

    def verifier_info(self) -> VerifierInfo:
        return VerifierInfo(name="letters-exact", version="1.0.0")

    async def verify(self, ctx: EpisodeContext) -> Assessment:
        solved_at = ctx.state.get("solved_at")
        reward = 0.0 if solved_at is None else 0.5 ** (int(solved_at) - 1)
        return Assessment(
            reward=reward,
            passed=solved_at == 1,
            components={"named": float(solved_at is not None), "attempts": ctx.state["attempts"]},
            feedback="never named" if solved_at is None else f"named at attempt {solved_at}",
        )

    def oracle(self, task: Task) -> list[Action]:
        return [Action(tool="guess", arguments={"letter": LettersPrivate.of(task).answer})]

    def null(self, task: Task) -> list[Action]:
        return [Action(tool="submit", arguments={})]

    def cheat_surface(self, task: Task) -> CheatSurface:
        """Answers go to `submit`; the right one is the private letter, the labels the
        alphabet's letters."""
        return CheatSurface(
            answer=lambda text: Action(tool="submit", arguments={"answer": text}),
            expected=LettersPrivate.of(task).answer,
            labels=tuple(LettersPublic.of(task).alphabet),
        )

    def cheats(self, task: Task) -> list[tuple[str, list[Action]]]:
        letter = LettersPublic.of(task).letter
        return [("copy-letter", [Action(tool="submit", arguments={"answer": letter})])]
