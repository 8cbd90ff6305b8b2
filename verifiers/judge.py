"""A model as a verifier: rubric scores, pairwise preferences, for any family.

A family hands the judge a `Subject` (the task, the server-only reference, the candidate the
policy wrote) and a `Rubric` (criteria, each with ordered choices worst -> best); the judge
answers in a JSON schema with a short reason before each choice. Two rules carry the design:

- The candidate is data, never instructions. It goes into the prompt only between fence
  lines that carry a nonce drawn per call (`secrets.token_hex`), and any text in it that
  looks like a fence marker is neutralised first (`fence`), so no candidate can close its
  fence, whatever nonce it guesses. The system message tells the judge that anything inside
  is part of the candidate.
- Nothing the candidate wrote can make the judge fail. A reply that does not parse or does
  not validate is asked again (up to `JudgeConfig.max_attempts`), then the judge is
  `JudgeUnavailable` (the episode is void, never 0): the policy's text sits inside the
  fence, so a malformed reply is the judge's fault (docs/reference/judges.md, "The judge verifier").

Every verdict carries a `JudgeRecord`: endpoint, model, sampling, the digest of the judging
settings (prompt template + rubric, not the candidate), one digest per call of the full
prompt, and the attempts it took.

Group rewards (a whole GRPO group of one task), one score in [0, 1] per candidate:
- `tournament`: every pair judged in both orders (`compare_pair` with swap); a candidate's
  score is its win rate, a tie or a pair whose two orders disagree counting 0.5 to each.
  n(n-1) calls, so a group is bounded (MAX_GROUP).
- `rank_group` (in the style of RULER): one call sees every candidate, each fenced under
  its own id, and scores each 0..10. They are shown in an order shuffled by a seed drawn
  from the judging settings and the candidates, so the same group is always shown the same
  way, while the input order (the sampler's) never tells the judge anything.

The rubric model lives in verifiers/judge_rubric.py, the prompt, fences and reply parsing in
verifiers/judge_prompt.py; the names a family needs are all importable from here.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Generic, Literal, TypeVar

from palaestra.verifiers.judge_prompt import (
    FENCE_CLOSE,
    FENCE_OPEN,
    PROMPT_VERSION,
    Malformed,
    PairReply,
    build_messages,
    defang,
    fence,
    fenced_blocks,
    fenced_candidates,
    pair_schema,
    parse_rank_reply,
    parse_rubric_reply,
    prompt_sha256,
    rank_schema,
    rubric_schema,
    validated,
)
from palaestra.verifiers.judge_protocol import (
    JudgeCache,
    JudgeChat,
    JudgeSampling,
    JudgeUnavailable,
)
from palaestra.verifiers.judge_rubric import Criterion, Rubric, RubricError, digest_of

T = TypeVar("T")
MAX_GROUP = 16

# ---------------------------------------------------------------- settings and results


@dataclass(frozen=True)
class JudgeConfig:
    """Which endpoint judges, how it samples, how many malformed replies it may give."""

    judge: str
    sampling: JudgeSampling = field(default_factory=JudgeSampling)
    max_attempts: int = 3
    # candidate text a call may show, in UTF-8 bytes (a token is at least one byte, so this
    # bounds tokens too), shared by its candidates, counted after neutralising; the rest is
    # cut, saying so: a long or dense answer can never overflow the judge's context
    max_candidate_chars: int = 24_000

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, not {self.max_attempts}")
        if self.max_candidate_chars < 100:
            raise ValueError(f"max_candidate_chars must be >= 100, not {self.max_candidate_chars}")

    def digest(self, rubric: Rubric) -> str:
        """Everything that decides a verdict but the subject: the verdict cache's third key."""
        return digest_of(
            {
                "rubric": rubric.digest(),
                "prompt": PROMPT_VERSION,
                "judge": self.judge,
                "sampling": asdict(self.sampling),
                "max_attempts": self.max_attempts,
                "max_candidate_chars": self.max_candidate_chars,
            }
        )


@dataclass(frozen=True)
class Subject:
    """What is judged: the task as asked, the server-only reference, the candidate's text."""

    task: str
    reference: str
    candidate: str


@dataclass(frozen=True)
class JudgeRecord:
    """How one verdict was reached, for a verdict's feedback or info."""

    endpoint: str
    model: str
    prompt_sha256: str  # the prompt template and rubric: the judging settings
    rubric_digest: str
    sampling: JudgeSampling
    attempts: int
    cached: bool = False
    mode: str = "rubric"
    config_digest: str = ""
    call_sha256: tuple[str, ...] = ()  # each call's full prompt (nonce and candidate included)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["call_sha256"] = list(self.call_sha256)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JudgeRecord:
        values = dict(data)
        values["sampling"] = JudgeSampling(**values["sampling"])
        values["call_sha256"] = tuple(values.get("call_sha256", ()))
        return cls(**values)


@dataclass(frozen=True)
class RubricVerdict:
    """score: the weighted mean of the components, each the value of the judge's choice."""

    score: float
    components: dict[str, float]
    reasons: dict[str, str]
    record: JudgeRecord

    def as_dict(self) -> dict[str, Any]:
        return {
            "score": self.score,
            "components": dict(self.components),
            "reasons": dict(self.reasons),
            "record": self.record.as_dict(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RubricVerdict:
        return cls(
            score=float(data["score"]),
            components={k: float(v) for k, v in data["components"].items()},
            reasons=dict(data["reasons"]),
            record=JudgeRecord.from_dict(data["record"]),
        )


@dataclass(frozen=True)
class PairVerdict:
    """preference: 1 = a better, 0 = b better, 0.5 = tie or the two orders disagreed."""

    preference: float
    consistent: bool
    records: tuple[JudgeRecord, ...]
    reasons: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {
            "preference": self.preference,
            "consistent": self.consistent,
            "reasons": list(self.reasons),
            "records": [r.as_dict() for r in self.records],
        }


@dataclass(frozen=True)
class GroupVerdict:
    """One score in [0, 1] per candidate, in the order the candidates were given."""

    scores: list[float]
    method: str
    records: tuple[JudgeRecord, ...]
    inconsistent: int = 0  # tournament: pairs whose two orders disagreed

    def as_dict(self) -> dict[str, Any]:
        return {
            "scores": list(self.scores),
            "method": self.method,
            "inconsistent": self.inconsistent,
            "records": [r.as_dict() for r in self.records],
        }


@dataclass(frozen=True)
class JudgedSubject:
    """What a family hands the group scorer for one episode."""

    rubric: Rubric
    config: JudgeConfig
    subject: Subject


class MalformedJudgeOutput(JudgeUnavailable):
    """Every attempt's reply failed to parse or validate (the judge's fault: void)."""

    def __init__(self, endpoint: str, attempts: int, last_problem: str) -> None:
        last_problem = last_problem[:200]
        super().__init__(
            endpoint, f"malformed judge output after {attempts} attempts ({last_problem})"
        )
        self.attempts = attempts
        self.last_problem = last_problem


# ---------------------------------------------------------------- calls


@dataclass(frozen=True)
class Asked(Generic[T]):
    """A parsed reply and the record of how it was obtained."""

    value: T
    record: JudgeRecord


async def ask(
    chat: JudgeChat,
    config: JudgeConfig,
    rubric: Rubric,
    mode: str,
    shown: tuple[str, str, Sequence[tuple[str, str]]],
    schema: Mapping[str, Any],
    parse: Callable[[str, Sequence[str]], T],
) -> Asked[T]:
    """Call the judge until a reply parses (fresh nonce each time), within max_attempts;
    `parse` is also given the candidates as the judge saw them (their verdicts are not its).
    Transport faults are the endpoint's to retry: JudgeUnavailable passes through."""
    digests: list[str] = []
    problem = ""
    for attempt in range(1, config.max_attempts + 1):
        prompt = build_messages(mode, rubric, *shown, budget=config.max_candidate_chars)
        digests.append(digest_of(prompt))
        text = await chat.complete(prompt, config.sampling, schema=schema)
        try:
            value = parse(
                text if isinstance(text, str) else "", fenced_candidates(prompt[-1]["content"])
            )
        except Malformed as exc:
            problem = str(exc)
            continue
        record = JudgeRecord(
            endpoint=chat.name,
            model=chat.model,
            prompt_sha256=prompt_sha256(rubric, mode),
            rubric_digest=rubric.digest(),
            sampling=config.sampling,
            attempts=attempt,
            mode=mode,
            config_digest=config.digest(rubric),
            call_sha256=tuple(digests),
        )
        return Asked(value, record)
    raise MalformedJudgeOutput(chat.name, config.max_attempts, problem)


async def gather_all(calls: Sequence[Awaitable[T]]) -> list[T]:
    """Run `calls` concurrently; on the first error cancel the rest and raise it."""
    tasks = [asyncio.ensure_future(c) for c in calls]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def text_digest(text: str) -> str:
    """sha256 of any str, lone surrogates included (text the policy wrote may hold them)."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def cache_key(
    state_key: tuple[str, str], config: JudgeConfig, rubric: Rubric, model: str, subject: Subject
) -> str:
    """(task digest, final-state digest, config digest), the endpoint's model (an operator
    who points the endpoint at another model gets fresh verdicts) and the subject's own
    digest: a family whose state digest misses the candidate (an answer given through a
    tool, not left in the workspace) must not hand one candidate another's verdict."""
    task_digest, state_digest = state_key
    texts = (subject.task, subject.reference, subject.candidate)
    subject_digest = [text_digest(t) for t in texts]
    return digest_of([task_digest, state_digest, config.digest(rubric), model, subject_digest])


async def score_rubric(
    chat: JudgeChat,
    rubric: Rubric,
    subject: Subject,
    config: JudgeConfig,
    *,
    cache: JudgeCache | None = None,
    state_key: tuple[str, str] | None = None,
) -> RubricVerdict:
    """The rubric verdict on one candidate. With `cache` and `state_key` (task digest,
    final-state digest) a verdict already given for the same state and settings is
    returned without a call; only verdicts are cached, never failures."""
    key = None
    if cache is not None and state_key is not None:
        key = cache_key(state_key, config, rubric, chat.model, subject)
        if (hit := cache.get(key)) is not None:
            try:
                verdict = RubricVerdict.from_dict(hit)
            except (KeyError, TypeError, ValueError, AttributeError):
                pass  # an entry of another shape: judge again (and overwrite it)
            else:
                return replace(verdict, record=replace(verdict.record, cached=True))

    shown = (subject.task, subject.reference, [("CANDIDATE", subject.candidate)])
    asked = await ask(
        chat, config, rubric, "rubric", shown, rubric_schema(rubric),
        lambda text, quoted: parse_rubric_reply(rubric, text, quoted),
    )  # fmt: skip
    components, reasons = asked.value
    verdict = RubricVerdict(rubric.score(components), components, reasons, asked.record)
    if key is not None and cache is not None:
        cache.put(key, verdict.as_dict())
    return verdict


async def _prefer(
    chat: JudgeChat, rubric: Rubric, task: str, reference: str, a: str, b: str, config: JudgeConfig
) -> tuple[float, str, JudgeRecord]:
    """One pairwise call with `a` shown as A: 1 if A wins, 0 if B, 0.5 for a tie."""
    shown = (task, reference, [("CANDIDATE-A", a), ("CANDIDATE-B", b)])
    asked = await ask(
        chat, config, rubric, "pair", shown, pair_schema(),
        lambda text, quoted: validated(PairReply, text, quoted),
    )  # fmt: skip
    reply: PairReply = asked.value
    return {"A": 1.0, "B": 0.0, "tie": 0.5}[reply.winner], reply.reason, asked.record


async def compare_pair(
    chat: JudgeChat,
    rubric: Rubric,
    task: str,
    reference: str,
    a: str,
    b: str,
    config: JudgeConfig,
    *,
    swap: bool = True,
) -> PairVerdict:
    """Which of `a`, `b` is better. With `swap`, both orders are judged (concurrently): a
    preference counts only when both agree; otherwise 0.5 and consistent=False, so a judge's
    position bias never decides. Without it, one call and consistent=True (unchecked)."""
    if not swap:
        pref, reason, record = await _prefer(chat, rubric, task, reference, a, b, config)
        return PairVerdict(pref, True, (record,), (reason,))
    (first, r1, rec1), (second, r2, rec2) = await gather_all(
        [
            _prefer(chat, rubric, task, reference, a, b, config),
            _prefer(chat, rubric, task, reference, b, a, config),
        ]
    )
    swapped = 1.0 - second  # the second call showed b as A
    consistent = first == swapped
    return PairVerdict(first if consistent else 0.5, consistent, (rec1, rec2), (r1, r2))


# ---------------------------------------------------------------- groups


def _check_size(candidates: Sequence[str]) -> None:
    if not 2 <= len(candidates) <= MAX_GROUP:
        raise ValueError(f"a judged group needs 2 to {MAX_GROUP} candidates, not {len(candidates)}")


async def tournament(
    chat: JudgeChat,
    rubric: Rubric,
    task: str,
    reference: str,
    candidates: Sequence[str],
    config: JudgeConfig,
) -> GroupVerdict:
    """Round robin with swap checks; score = win rate (ties and inconsistent pairs 0.5)."""
    _check_size(candidates)
    pairs = list(itertools.combinations(range(len(candidates)), 2))
    verdicts = await gather_all(
        [
            compare_pair(chat, rubric, task, reference, candidates[i], candidates[j], config)
            for i, j in pairs
        ]
    )
    wins = [0.0] * len(candidates)
    for (i, j), verdict in zip(pairs, verdicts, strict=True):
        wins[i] += verdict.preference
        wins[j] += 1.0 - verdict.preference
    return GroupVerdict(
        scores=[w / (len(candidates) - 1) for w in wins],
        method="tournament",
        records=tuple(r for v in verdicts for r in v.records),
        inconsistent=sum(not v.consistent for v in verdicts),
    )


def shown_order(config: JudgeConfig, rubric: Rubric, candidates: Sequence[str]) -> list[int]:
    """The order `rank_group` shows the candidates in: a shuffle seeded by the settings
    and the candidates' digests, so the same group always gets the same order."""
    seed = hashlib.sha256(config.digest(rubric).encode())
    for text in candidates:
        seed.update(bytes.fromhex(text_digest(text)))
    order = list(range(len(candidates)))
    random.Random(seed.digest()).shuffle(order)
    return order


async def rank_group(
    chat: JudgeChat,
    rubric: Rubric,
    task: str,
    reference: str,
    candidates: Sequence[str],
    config: JudgeConfig,
) -> GroupVerdict:
    """One call scores the whole group (RULER style); scores 0..10 mapped to [0, 1]."""
    _check_size(candidates)
    order = shown_order(config, rubric, candidates)
    ids = [f"c{k + 1}" for k in range(len(order))]  # by shown position, not input position
    fenced = [(f"CANDIDATE-{ids[k]}", candidates[i]) for k, i in enumerate(order)]
    asked = await ask(
        chat, config, rubric, "rank", (task, reference, fenced), rank_schema(ids),
        lambda text, quoted: parse_rank_reply(ids, text, quoted),
    )  # fmt: skip
    by_id: dict[str, float] = asked.value
    scores = [0.0] * len(candidates)
    for k, i in enumerate(order):
        scores[i] = by_id[ids[k]]
    return GroupVerdict(scores=scores, method="rank", records=(asked.record,))


async def judge_group(
    chat: JudgeChat,
    subjects: Sequence[JudgedSubject],
    method: Literal["rank", "tournament"] = "rank",
) -> GroupVerdict:
    """Group scores for the episodes of one task, as their families described them; they
    must share the rubric, the judge settings, the task and the reference."""
    if not subjects:
        raise ValueError("a judged group needs candidates")
    first = subjects[0]
    for other in subjects[1:]:
        same = (other.rubric, other.config, other.subject.task, other.subject.reference)
        if same != (first.rubric, first.config, first.subject.task, first.subject.reference):
            raise ValueError(
                "a judged group must share its rubric, judge settings, task and reference"
            )
    candidates = [s.subject.candidate for s in subjects]
    scorer = rank_group if method == "rank" else tournament
    args = (first.subject.task, first.subject.reference, candidates, first.config)
    return await scorer(chat, first.rubric, *args)


__all__ = [
    "FENCE_CLOSE",
    "FENCE_OPEN",
    "MAX_GROUP",
    "PROMPT_VERSION",
    "Criterion",
    "GroupVerdict",
    "JudgeConfig",
    "JudgeRecord",
    "JudgeUnavailable",
    "JudgedSubject",
    "MalformedJudgeOutput",
    "PairVerdict",
    "Rubric",
    "RubricError",
    "RubricVerdict",
    "Subject",
    "compare_pair",
    "defang",
    "fence",
    "fenced_blocks",
    "fenced_candidates",
    "judge_group",
    "prompt_sha256",
    "rank_group",
    "score_rubric",
    "tournament",
]
