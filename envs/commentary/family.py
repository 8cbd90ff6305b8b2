"""The `finance-commentary` family: read a generated annual report, write an analyst's comment.

The document side is the finance family's, composed (`self.documents`): the PDF is
generated from the task's private seeds at reset, cached on disk and in memory, and read
with the same tools. What changes is the answer and its verifier: `submit` takes a short
commentary, and a judge model grades it by a rubric (envs/commentary/rubric.toml) against
a reference the server builds from the accounts behind the PDF (envs/commentary/truth.py).
The reference goes only into the judge's prompt: never into an observation, a verdict's
feedback or a component, so it stays on the server on a sealed split as on a public one.

Reward: the rubric's weighted score, except that a commentary with any criterion at its
worst choice (no right figure, every direction wrong, off the question) earns 0; passed at
`PASS_AT`. An empty commentary is 0 (`no_answer`) without a judge call. A judge that gives
no verdict raises JudgeUnavailable and the episode is void (server/episode.assess).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path
from typing import cast

from pydantic import BaseModel, ConfigDict, Field

from palaestra.envs import (
    Action,
    Assessment,
    EpisodeContext,
    Family,
    FamilySettings,
    JudgeConfig,
    JudgedSubject,
    JudgeSampling,
    Observation,
    PrivateFields,
    Rubric,
    RubricVerdict,
    ServerPaths,
    StepOutcome,
    Subject,
    Task,
    TaskFieldsError,
    Tool,
    ToolArgs,
    VerifierInfo,
    score_rubric,
)
from palaestra.envs.commentary.answers import cheat_texts, oracle_commentary
from palaestra.envs.commentary.tasks import MAX_CHARS
from palaestra.envs.commentary.truth import METRICS, Truth, reference_text, truth_of
from palaestra.envs.finance.family import (
    DocumentSpec,
    FinanceFamily,
    FinancePublic,
    FinanceSettings,
    FinanceState,
)
from palaestra.envs.finance.tasks import build_document
from palaestra.verifiers.judge import FENCE_CLOSE

RUBRIC = Path(__file__).with_name("rubric.toml")
PASS_AT = 0.85  # every criterion at its best choice but relevance one step down, or better
SAMPLING = JudgeSampling(temperature=0.0, top_p=1.0, max_tokens=1024, seed=0)


class CommentaryArgs(ToolArgs):
    commentary: str = Field(
        default="",
        max_length=MAX_CHARS,
        description=f"the commentary, plain text of at most {MAX_CHARS} characters",
    )


class Ask(BaseModel):
    """What the question asks: metrics (truth.METRICS) between two offsets of the accounts."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    metrics: list[str] = Field(min_length=1, max_length=4)
    offset_from: int = Field(ge=1, le=4)
    offset_to: int = Field(ge=0, le=3)


class CommentaryPrivate(PrivateFields):
    """The document's seeds (the accounts behind the PDF are the truth) and what was asked.
    Same shape as the finance family's private fields, so its document code reads them."""

    document: DocumentSpec
    gold: Ask

    def seeds(self) -> tuple[int, int, int]:
        doc = self.document
        return doc.structure_seed, doc.value_seed, doc.level


_READ_TOOLS: tuple[Tool, ...] = tuple(
    t for t in FinanceFamily.tools if t.name not in ("submit", "submit_text")
)


class CommentaryState(FinanceState):
    """The finance family's (the report), with the reference and the commentary."""

    reference: str = ""  # built at reset; it goes into the judge's prompt only
    commentary: str | None = None  # what `submit` gave (None: never submitted)


Ctx = EpisodeContext[CommentaryState]


class CommentarySettings(FinanceSettings):
    """`[families.finance-commentary]`: the finance family's report settings (its reports
    are generated and cached the same way, by default in the same folder) and the judge."""

    judge: str = Field(
        default="default",
        min_length=1,
        description="the judge endpoint (a name of the server's `judges` setting) that grades",
    )


def _documents(ctx: Ctx) -> EpisodeContext[FinanceState]:
    """The context as the composed finance family reads it (its state extends finance's)."""
    return cast(EpisodeContext[FinanceState], ctx)


class CommentaryFamily(Family[CommentaryState]):
    name = "finance-commentary"
    description = (
        "Read a PDF annual report with tools and write a short analyst commentary on the "
        "change of the metrics asked; a judge model grades it by a rubric against the "
        "report's figures."
    )
    version = "1.0.0"
    tools = (
        *_READ_TOOLS,
        Tool(
            "submit",
            f"End the episode with {{commentary}}: plain text, at most {MAX_CHARS} characters.",
            CommentaryArgs,
        ),
    )
    public_fields = FinancePublic
    private_fields = CommentaryPrivate

    settings_model = CommentarySettings
    settings: CommentarySettings

    def __init__(
        self, settings: FamilySettings | None = None, server: ServerPaths | None = None
    ) -> None:
        super().__init__(settings, server)
        # the report: generation, caches, tools (finance's settings, from this family's own)
        reports = FinanceSettings(
            **self.settings.model_dump(include=set(FinanceSettings.model_fields))
        )
        self.documents = FinanceFamily(reports, self.server)
        self.rubric = Rubric.load(RUBRIC)
        self.config = JudgeConfig(judge=self.settings.judge, sampling=SAMPLING)

    def judges(self) -> frozenset[str]:
        return frozenset({self.settings.judge})

    # -- tasks -------------------------------------------------------------------------------
    def validate_task(self, task: Task) -> None:
        super().validate_task(task)
        private = CommentaryPrivate.of(task)
        if private.document.kind != "generated":
            raise TaskFieldsError(
                task, "private.document.kind: must be 'generated' (the truth is its accounts)"
            )
        ask = private.gold
        for name in ask.metrics:
            metric = METRICS.get(name)
            if metric is None:
                known = ", ".join(sorted(METRICS))
                raise TaskFieldsError(
                    task, f"private.gold.metrics: unknown metric {name!r}; known: {known}"
                )
            for offset in (ask.offset_from, ask.offset_to):
                if offset not in metric.years():
                    raise TaskFieldsError(
                        task,
                        f"private.gold: the report shows no {name} for offset {offset} "
                        f"(it has offsets {metric.years().start} to {metric.years().stop - 1})",
                    )
        if ask.offset_from <= ask.offset_to:
            raise TaskFieldsError(
                task, "private.gold.offset_from: must be an earlier year than offset_to (larger)"
            )

    def truth(self, task: Task) -> Truth:
        """The figures the question asks about (milliseconds, cached by the seeds)."""
        private = CommentaryPrivate.of(task)
        accounts = build_document(*private.seeds()).accounts
        ask = private.gold
        return truth_of(accounts, ask.metrics, ask.offset_from, ask.offset_to)

    # -- episode -----------------------------------------------------------------------------
    async def reset(self, ctx: Ctx) -> Observation:
        observation = await self.documents.reset(_documents(ctx))
        # The reference, built once per episode off the event loop; it stays in the
        # server's memory (ctx.state is never sent) until the judge's prompt.
        truth = await asyncio.to_thread(self.truth, ctx.task)
        ctx.state.reference = reference_text(truth)
        return observation

    async def step(self, ctx: Ctx, tool: Tool, args: ToolArgs) -> StepOutcome:
        """`submit` is this family's; the report's tools are the finance family's."""
        if isinstance(args, CommentaryArgs):
            ctx.state.commentary = args.commentary
            return StepOutcome(Observation(text="submitted"), done=True)
        return await self.documents.step(_documents(ctx), tool, args)

    def verifier_info(self) -> VerifierInfo:
        return VerifierInfo(name="finance-commentary-rubric", version=self.version)

    def subject(self, ctx: Ctx) -> Subject | None:
        """What the judge grades: None for an episode with no commentary, or an empty one."""
        commentary = ctx.state.commentary
        if commentary is None or not commentary.strip():
            return None
        question = FinancePublic.of(ctx.task).question
        return Subject(task=question, reference=ctx.state.reference, candidate=commentary)

    def judged_subject(self, ctx: Ctx) -> JudgedSubject | None:
        """What the group scorer judges (the same subject as `verify`'s); None is a 0."""
        subject = self.subject(ctx)
        return None if subject is None else JudgedSubject(self.rubric, self.config, subject)

    async def verify(self, ctx: Ctx) -> Assessment:
        subject = self.subject(ctx)
        if subject is None:
            zeros = {c.name: 0.0 for c in self.rubric.criteria}
            empty = ctx.state.commentary is not None
            said = "the commentary is empty" if empty else "no commentary submitted"
            return Assessment(
                reward=0.0, passed=False, components=zeros, feedback=said, failure="no_answer"
            )
        chat = ctx.judges.get(self.settings.judge)  # JudgeUnavailable: no such endpoint, void
        digest = "sha256:" + hashlib.sha256(subject.candidate.encode()).hexdigest()
        verdict = await score_rubric(
            chat,
            self.rubric,
            subject,
            self.config,
            cache=ctx.judges.cache,
            state_key=(ctx.task.digest, digest),
        )
        reward = reward_of(verdict)
        return Assessment(
            reward=reward,
            passed=reward >= PASS_AT,
            components=dict(verdict.components),
            feedback=feedback_of(verdict, reward),
        )

    # -- reference attempts ------------------------------------------------------------------
    def oracle(self, task: Task) -> list[Action]:
        return [_submit(oracle_commentary(self.truth(task)))]

    def null(self, task: Task) -> list[Action]:
        return [Action(tool="submit", arguments={})]

    def cheats(self, task: Task) -> list[tuple[str, list[Action]]]:
        criteria = {c.name: list(c.choices) for c in self.rubric.criteria}
        guessed = FENCE_CLOSE.format(label="CANDIDATE", nonce="0" * 32)
        private = CommentaryPrivate.of(task)
        printed = list(build_document(*private.seeds()).numbers.figures.values())
        texts = cheat_texts(self.truth(task), criteria, guessed, printed, MAX_CHARS)
        return [("whitespace", [_submit(" \n\t ")])] + [
            (name, [_submit(text)]) for name, text in texts
        ]


def reward_of(verdict: RubricVerdict) -> float:
    """The score, or 0 where any criterion sits at its worst choice."""
    return verdict.score if min(verdict.components.values()) > 0 else 0.0


def feedback_of(verdict: RubricVerdict, reward: float) -> str:
    """Scores and how they were reached; never the judge's reasons (they may quote the
    reference) nor the reference itself."""
    parts = ", ".join(f"{name} {value:.2f}" for name, value in verdict.components.items())
    gate = "" if reward == verdict.score else " (a criterion at its worst choice pays 0)"
    record = json.dumps(verdict.record.as_dict(), sort_keys=True, separators=(",", ":"))
    return f"judge score {verdict.score:.3f}: {parts}; reward {reward:.3f}{gate}; judge {record}"


def _submit(commentary: str) -> Action:
    return Action(tool="submit", arguments={"commentary": commentary})
