"""`JudgePreFilter`: a cheap OpenAI-compatible judge as the collector's pre-filter.

It scores a final answer against a rubric through `verifiers.judge.score_rubric`, seeing
the public task only — never a reference, which a trainer does not have — so it can spot
clearly inferior answers (empty, off-topic, malformed) but not wrong ones: set the
collector's `drop_below` low and watch `prefilter_agreement`. A judge that gives no
verdict never drops an answer (the full verifier decides), and is counted.

It lives here, not in palaestra.sdk.train.prefilter, because the sdk depends on nothing
else of palaestra (DESIGN §2) and the judge logic is palaestra.verifiers' (which may
depend on the sdk); the server never runs it.
"""

from __future__ import annotations

import math

from palaestra.verifiers.judge import JudgeConfig, Rubric, Subject, score_rubric
from palaestra.verifiers.judge_protocol import JudgeChat, JudgeUnavailable


class JudgePreFilter:
    """`PreFilter` (sdk/train/prefilter.py) over a judge endpoint (`JudgeChat`, e.g. a
    verifiers.judge_endpoint.JudgeEndpoint on a small model)."""

    def __init__(self, chat: JudgeChat, rubric: Rubric, config: JudgeConfig) -> None:
        self.chat = chat
        self.rubric = rubric
        self.config = config
        self.unavailable = 0  # answers the judge could not score (kept)

    async def score(self, task: str, text: str) -> float:
        subject = Subject(task=task, reference="", candidate=text)
        try:
            verdict = await score_rubric(self.chat, self.rubric, subject, self.config)
        except JudgeUnavailable:
            self.unavailable += 1
            return math.inf
        return verdict.score
