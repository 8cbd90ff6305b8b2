"""The letters family (see the package docstring)."""

from __future__ import annotations

from pydantic import Field

from palaestra.envs import (
    Action,
    Assessment,
    CheatSurface,
    EpisodeContext,
    Family,
    InvalidActionError,
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


class LettersState(State):
    attempts: int = 0  # answers given so far (guesses and the submit)
    solved_at: int | None = None  # the attempt that named the right letter


Ctx = EpisodeContext[LettersState]


class LettersFamily(Family[LettersState]):
    name = "letters"
    description = (
        "Name the letter `shift` places after a given one (cyclic); wrong guesses get a "
        "hint, later or earlier. For training demos: a tiny model learns it on a CPU."
    )
    version = "0.1.0"
    public_fields = LettersPublic
    private_fields = LettersPrivate

    async def reset(self, ctx: Ctx) -> Observation:
        fields = LettersPublic.of(ctx.task)
        alphabet, letter, shift, attempts = (
            fields.alphabet,
            fields.letter,
            fields.shift,
            fields.attempts,
        )
        text = (
            f"Which letter comes {shift} after {letter!r} in {alphabet!r} (wrapping around)? "
            f"You have {attempts} attempts; each wrong guess gets a hint."
        )
        data = {"letter": letter, "shift": shift, "alphabet": alphabet, "attempts": attempts}
        return Observation(text=text, data=data)

    @tool(
        "Guess the letter. Right: the episode ends. Wrong: a hint says whether the "
        "answer comes later or earlier in the alphabet, while attempts remain."
    )
    async def guess(self, ctx: Ctx, args: GuessArgs) -> StepOutcome:
        fields = LettersPublic.of(ctx.task)
        alphabet, answer = fields.alphabet, LettersPrivate.of(ctx.task).answer
        guess = args.letter.strip()
        if len(guess) != 1 or guess not in alphabet:
            raise InvalidActionError(
                f"a guess is one letter of {alphabet!r}; got {args.letter!r}",
                code="invalid_guess",
            )
        state = ctx.state
        state.attempts += 1
        if guess == answer:
            state.solved_at = state.attempts
            return StepOutcome(Observation(text="right", data={"hint": "right"}), done=True)
        left = fields.attempts - state.attempts
        hint = "later" if alphabet.index(answer) > alphabet.index(guess) else "earlier"
        data = {"hint": hint, "attempts_left": left}
        if left <= 0:
            return StepOutcome(Observation(text="wrong; no attempts left", data=data), done=True)
        return StepOutcome(Observation(text=f"wrong; {hint} ({left} left)", data=data))

    @tool("End the episode with a final answer.")
    async def submit(self, ctx: Ctx, args: SubmitArgs) -> StepOutcome:
        ctx.state.attempts += 1
        if args.answer.strip() == LettersPrivate.of(ctx.task).answer:
            ctx.state.solved_at = ctx.state.attempts
        return StepOutcome(Observation(text="submitted"), done=True)

    def verifier_info(self) -> VerifierInfo:
        return VerifierInfo(name="letters-exact", version="1.0.0")

    async def verify(self, ctx: Ctx) -> Assessment:
        solved_at = ctx.state.solved_at
        reward = 0.0 if solved_at is None else 0.5 ** (solved_at - 1)
        return Assessment(
            reward=reward,
            passed=solved_at == 1,
            components={"named": float(solved_at is not None), "attempts": ctx.state.attempts},
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
