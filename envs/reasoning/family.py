"""The `reasoning` family: one question from a reasoning-gym dataset, one answer, its own scorer.

Public fields: `question` (the observation) and `dataset`. Private fields: what rebuilds the
dataset and the entry on the server (`dataset`, `level`, `seed`, `size`, `index`), the entry's
`answer` and `metadata` (as JSON), `item_seed` (seed + index, the seed the split rule uses)
and `common_answers` (the domain's most common training answers, played as cheats).

Tools: `think` (a note; does nothing) and `submit(answer)`, which ends the episode. The
verifier regenerates reasoning-gym's own entry and calls the dataset's own
`score_answer(answer, entry)` in the server process (never in a sandbox: it is library code
and the answer is only a string; `gym` makes the few scorers that evaluate the answer safe);
reward = that score, `passed` = score >= 1.0. No answer at all (`submit` without one, or an
episode truncated before it) scores 0 without asking the scorer: a few reasoning-gym scorers
give 0.01 to `None`, and the null agent must score 0. An empty string is an answer.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
from dataclasses import dataclass
from typing import Any

from pydantic import Field

from palaestra.envs import (
    Action,
    Assessment,
    EpisodeContext,
    Family,
    FamilySettings,
    Observation,
    PrivateFields,
    PublicFields,
    ServerPaths,
    State,
    StepOutcome,
    Task,
    ToolArgs,
    VerifierInfo,
    tool,
)
from palaestra.envs.reasoning import canon, cheats, constraints, guard, gym

log = logging.getLogger(__name__)

MAX_ANSWER = 20_000
PASS_THRESHOLD = 1.0


class ThinkArgs(ToolArgs):
    note: str = Field(default="", max_length=100_000, description="a note to yourself")


class SubmitArgs(ToolArgs):
    answer: str | None = Field(
        default=None, max_length=MAX_ANSWER, description="the final answer, as the question asks"
    )


class ReasoningPublic(PublicFields):
    question: str = ""
    dataset: str = ""


class ReasoningPrivate(PrivateFields):
    """What rebuilds the entry on the server, and the entry's own answer and metadata."""

    dataset: str
    level: str
    seed: int
    size: int
    index: int
    answer: str
    metadata: dict[str, Any] = Field(default_factory=dict)
    # The domain's most common training answers: played as constants (null-information).
    common_answers: list[str] = Field(default_factory=list)


class ReasoningState(State):
    submitted: bool = False
    answer: str | None = None  # None: submitted without one (or never submitted)


Ctx = EpisodeContext[ReasoningState]


class ReasoningFamily(Family[ReasoningState]):
    name = "reasoning"
    description = (
        "Procedural reasoning problems from reasoning-gym, scored by each dataset's own scorer."
    )
    version = "0.1.0"
    public_fields = ReasoningPublic
    private_fields = ReasoningPrivate

    async def reset(self, ctx: Ctx) -> Observation:
        return Observation(text=ReasoningPublic.of(ctx.task).question)

    @tool("Write a note to yourself; it changes nothing.")
    async def think(self, ctx: Ctx, args: ThinkArgs) -> StepOutcome:
        return StepOutcome(Observation(text="noted"))

    @tool("End the episode with your final answer.")
    async def submit(self, ctx: Ctx, args: SubmitArgs) -> StepOutcome:
        ctx.state.submitted = True
        ctx.state.answer = args.answer
        return StepOutcome(Observation(text="submitted"), done=True)

    def __init__(
        self, settings: FamilySettings | None = None, server: ServerPaths | None = None
    ) -> None:
        super().__init__(settings, server)
        # reasoning-gym's scorers (sympy, eval) are not known to be thread-safe: one at a
        # time (scoring takes milliseconds). A full run once saw two oracle answers of
        # concurrent episodes score 0 that score 1 alone.
        self._scoring = threading.Lock()

    def verifier_info(self) -> VerifierInfo:
        return VerifierInfo(name="reasoning-gym", version=gym.rg_version())

    def _score(self, task: Task, answer: str | None) -> Scored:
        with self._scoring:
            return score_answer(task, answer)

    async def verify(self, ctx: Ctx) -> Assessment:
        scored = await asyncio.to_thread(self._score, ctx.task, ctx.state.answer)
        submitted = ctx.state.submitted
        return Assessment(
            reward=scored.reward,
            passed=scored.reward >= PASS_THRESHOLD,
            failure=scored.failure if submitted else "no_answer",
            components={"score": scored.reward},
            feedback=scored.feedback if submitted else "no answer submitted",
        )

    def oracle(self, task: Task) -> list[Action]:
        return [Action(tool="submit", arguments={"answer": ReasoningPrivate.of(task).answer})]

    def null(self, task: Task) -> list[Action]:
        return [Action(tool="submit", arguments={})]

    def cheats(self, task: Task) -> list[tuple[str, list[Action]]]:
        question = ReasoningPublic.of(task).question[:MAX_ANSWER]
        out = [
            ("empty-answer", [Action(tool="submit", arguments={"answer": ""})]),
            ("submit-question", [Action(tool="submit", arguments={"answer": question})]),
        ]
        private = ReasoningPrivate.of(task)
        for name, text in guard.degenerate_answers(question, private.answer):
            if name in ("label-empty", "echo-question"):  # the two above
                continue
            # An answer the guarded scorer calls fully correct is another form of the answer
            # ("0" for "0 days", "4.2291" for "4.22915" within the stated tolerance).
            if score_task(task, text)[0] >= PASS_THRESHOLD:
                continue
            out.append((name, [Action(tool="submit", arguments={"answer": text})]))
        # Answer forms (cheats.py) are never the answer by construction and always played;
        # only a grid fill that happens to keep every rule of the puzzle is a solution.
        for name, text in cheats.answer_cheats(private.dataset, question, private.answer):
            if name.startswith("grid-") and score_task(task, text)[0] >= PASS_THRESHOLD:
                continue
            out.append((name, [Action(tool="submit", arguments={"answer": text})]))
        # Null-information play: each of the domain's most common answers, wherever it is
        # not this task's own answer (a plan that also solves this task counts as a cheat).
        for name, text in cheats.common_answer_cheats(private.common_answers, private.answer):
            out.append((name, [Action(tool="submit", arguments={"answer": text})]))
        return out


def rebuild_args(task: Task) -> tuple[str, str, int, int, int]:
    p = ReasoningPrivate.of(task)
    return p.dataset, p.level, p.seed, p.size, p.index


@dataclass(frozen=True)
class Scored:
    """A scored answer: reward, feedback (never showing the answer) and, for an answer
    refused before or after the scorer, the failure class naming what it tried."""

    reward: float
    feedback: str
    failure: str | None = None


def score_task(task: Task, answer: str | None) -> tuple[float, str]:
    """(reward, feedback) for `answer` on `task`; see `score_answer`."""
    scored = score_answer(task, answer)
    return scored.reward, scored.feedback


def score_answer(task: Task, answer: str | None) -> Scored:
    """`answer` on `task`: brought to its one canonical form (canon.py: numbers finite,
    labels folded to exactly one label), scored by reasoning-gym's own scorer, then partial
    credit kept only for a candidate that keeps the puzzle's rules (constraints.py) and is
    not degenerate (guard.py).

    The entry is regenerated (reasoning-gym's own objects, exact types); a dataset whose
    generation is not reproducible (codeio, isomorphic_strings, knight_swap) regenerates
    another question or answer, and then the task's stored entry (question, answer,
    metadata) is scored. A scorer that raises on the answer gives 0, as reasoning-gym's
    scorers do for an answer they cannot parse.
    """
    if answer is None:
        return Scored(0.0, "no answer")
    args = rebuild_args(task)
    public, private = ReasoningPublic.of(task), ReasoningPrivate.of(task)
    form = canon.canonical(args[0], answer, private.answer)
    if form.refused is not None:
        return Scored(0.0, f"incorrect ({form.refused})", form.failure)
    answer = form.text
    entry: dict[str, Any] | None = gym.entry(*args)
    served = (public.question, private.answer)
    if entry is None or (entry["question"], entry["answer"]) != served:
        entry = {
            "question": public.question,
            "answer": private.answer,
            "metadata": private.metadata,
        }
    try:
        reward = gym.score(*args, answer, entry=entry)
    except Exception as exc:
        log.info("scorer of %s raised %s on an answer; scored 0", args[0], type(exc).__name__)
        return Scored(0.0, "the scorer could not read the answer")
    reward = min(1.0, max(0.0, reward)) if math.isfinite(reward) else 0.0
    if 0.0 < reward < PASS_THRESHOLD or (reward > 0.0 and args[0] in constraints.FULL):
        metadata = entry.get("metadata") or {}
        broken = constraints.breaks(args[0], answer, metadata, str(entry["answer"]))
        if broken is not None:
            return Scored(0.0, f"incorrect (breaks the puzzle's rules: {broken})", "breaks_rules")
    question = str(entry.get("question") or public.question)
    reward, refused = guard.guarded(args[0], reward, answer, question, str(entry["answer"]))
    if refused is not None:
        return Scored(0.0, f"incorrect ({refused})")
    if reward >= PASS_THRESHOLD:
        return Scored(reward, "correct")
    if reward > 0.0:
        return Scored(reward, f"partly correct (score {reward:.3g})")
    return Scored(reward, "incorrect")
