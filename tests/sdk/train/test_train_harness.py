"""sdk/train/harness.py: proxy records → token-in/token-out samples (the context-edit rule)
with ids from a real tokenizer (the tiny models' BPE and chat template), and
HarnessCollector over RecordedHarnessClient, a test double of the client that answers
recorded step records (the end-to-end run over a real server is in
tests/sdk/train/test_harness_training.py)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers", reason="needs the `train` extra")

from palaestra.sdk.client import AsyncClient
from palaestra.sdk.errors import error_from_response
from palaestra.sdk.harness import LLM_CALL_TOOL, HarnessOptions, LlmCall
from palaestra.sdk.models import (
    Action,
    EpisodeState,
    Limits,
    Observation,
    ResetRequest,
    ResetResponse,
    StepRecord,
    Verdict,
    VerifierInfo,
)
from palaestra.sdk.train.collector import CollectorConfig
from palaestra.sdk.train.harness import (
    HarnessCollector,
    SampleTags,
    TraceError,
    llm_calls,
    stop_reason,
    trajectories_from_calls,
)
from tests.peers.tiny_models import make_models
from tests.sdk.train.test_openai_server import CACHE

TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
HARNESS = HarnessOptions(name="bash-agent", model_endpoint="http://127.0.0.1:9/v1", model="tiny")


@pytest.fixture(scope="module")
def tok() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(make_models(CACHE / "tiny-models")["random"])


def render(tok: Any, messages: list[dict[str, Any]]) -> list[int]:
    """The prompt ids a chat server builds for `messages` (template, then tokenize)."""
    text = tok.apply_chat_template(
        messages, tools=TOOLS, add_generation_prompt=True, tokenize=False
    )
    return list(tok.encode(text, add_special_tokens=False))


def call(index: int, prompt: list[int], completion: list[int], at: float = 0.0) -> LlmCall:
    return LlmCall(
        index=index,
        api="openai-chat",
        request={},
        response={},
        prompt_token_ids=prompt,
        completion_token_ids=completion,
        logprobs=[-0.1 * (k + 1) for k in range(len(completion))],
        started_at=at,
        upstream_s=0.5,
        proxy_s=0.6,
    )


def reply_ids(tok: Any, text: str) -> list[int]:
    """What the model sampled for an assistant turn `text` (its ids, then <|im_end|>)."""
    return [*tok.encode(text, add_special_tokens=False), tok.convert_tokens_to_ids("<|im_end|>")]


def conversation(tok: Any) -> tuple[list[LlmCall], dict[str, list[int]]]:
    """Four calls of a harness: two turns, then it rewrites its context (a summary), then
    one more turn on the rewritten context."""
    system = {"role": "system", "content": "You are an agent in a shell."}
    user = {"role": "user", "content": "List the files, then submit."}
    first = 'Let me look.<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>'
    second = "Done. Two files."
    p0 = render(tok, [system, user])
    c0 = reply_ids(tok, first)
    turn = [system, user, {"role": "assistant", "content": first}]
    p1 = render(tok, [*turn, {"role": "tool", "content": "a.txt\nb.txt"}])
    c1 = reply_ids(tok, second)
    summary = {"role": "user", "content": "Summary so far: you listed a.txt and b.txt."}
    p2 = render(tok, [system, summary])  # the harness rewrote earlier turns
    c2 = reply_ids(tok, "ok")
    p3 = render(tok, [system, summary, {"role": "assistant", "content": "ok"}, user])
    c3 = reply_ids(tok, "submitting")
    calls = [call(0, p0, c0, 10.0), call(1, p1, c1, 12.0), call(2, p2, c2, 13.0),
             call(3, p3, c3, 15.0)]  # fmt: skip
    return calls, {"p0": p0, "c0": c0, "p1": p1, "c1": c1, "p2": p2, "c2": c2, "p3": p3, "c3": c3}


def test_extending_calls_make_one_sample_and_a_rewrite_starts_another(tok: Any) -> None:
    calls, ids = conversation(tok)
    assert ids["p1"][: len(ids["p0"]) + len(ids["c0"])] == ids["p0"] + ids["c0"]  # it extends
    tags = SampleTags(task="t:1", seed=3, group_id=2, sample_id=1, episode_id="ep")
    first, second = trajectories_from_calls(calls, 0.75, tags)

    env = ids["p1"][len(ids["p0"]) + len(ids["c0"]) :]
    assert tok.decode(env).startswith("\n<|im_start|>user\n<tool_response>\na.txt")
    assert first.prompt_ids == ids["p0"]
    assert first.completion_ids == ids["c0"] + env + ids["c1"]
    assert first.loss_mask == [1] * len(ids["c0"]) + [0] * len(env) + [1] * len(ids["c1"])
    assert first.logprobs == calls[0].logprobs + [0.0] * len(env) + calls[1].logprobs
    assert first.turns == 2 and first.generation_s == 1.0
    assert first.environment_s == pytest.approx(12.0 - 10.0 - 0.6)

    env3 = ids["p3"][len(ids["p2"]) + len(ids["c2"]) :]
    assert second.prompt_ids == ids["p2"]  # the rewritten context is the new prompt
    assert second.completion_ids == ids["c2"] + env3 + ids["c3"]
    assert sum(second.loss_mask) == len(ids["c2"]) + len(ids["c3"])
    for sample in (first, second):
        assert (sample.reward, sample.task, sample.seed, sample.episode_id) == (
            0.75,
            "t:1",
            3,
            "ep",
        )
        assert (sample.group_id, sample.sample_id) == (2, 1)


def test_a_reply_re_rendered_into_other_ids_starts_a_new_sample(tok: Any) -> None:
    # The model sampled "def" as three one-letter tokens; the chat template renders the
    # reply's text again and the tokenizer merges it: the next prompt does not extend.
    word = "return"
    split = [tok.encode(ch, add_special_tokens=False)[0] for ch in word]
    assert tok.encode(word, add_special_tokens=False) != split
    system = {"role": "system", "content": "s"}
    user = {"role": "user", "content": "u"}
    p0 = render(tok, [system, user])
    c0 = [*split, tok.convert_tokens_to_ids("<|im_end|>")]
    p1 = render(tok, [system, user, {"role": "assistant", "content": word}, user])
    assert tok.decode(c0, skip_special_tokens=True) == word
    samples = trajectories_from_calls([call(0, p0, c0), call(1, p1, [5, 6])], 1.0)
    assert [s.prompt_ids for s in samples] == [p0, p1]  # never an invented alignment
    assert [s.completion_ids for s in samples] == [c0, [5, 6]]
    assert all(s.loss_mask == [1] * len(s.completion_ids) for s in samples)


def test_bad_traces_are_refused(tok: Any) -> None:
    ok = call(0, [1, 2], [3])
    broken = ok.model_copy(update={"logprobs": []})
    with pytest.raises(TraceError, match="1 completion ids but 0 logprobs"):
        trajectories_from_calls([broken], 1.0)
    with pytest.raises(TraceError, match="no prompt token ids"):
        trajectories_from_calls([call(0, [], [3])], 1.0)
    assert trajectories_from_calls([], 1.0) == []


def record(index: int, c: LlmCall | None = None, **extra: Any) -> StepRecord:
    if c is None:
        return StepRecord(
            index=index, action=Action(tool="harness_end"), observation=Observation(), **extra
        )
    info = {"llm_call": c.model_dump(mode="json")}
    return StepRecord(
        index=index, action=Action(tool=LLM_CALL_TOOL), observation=Observation(), info=info
    )


def test_records_parse_in_call_order(tok: Any) -> None:
    calls, _ = conversation(tok)
    records = [record(0, calls[1]), record(1, calls[0]), record(2, truncated=True)]
    assert [c.index for c in llm_calls(records)] == [0, 1]
    assert llm_calls(records)[0] == calls[0]
    assert stop_reason(records) == "truncated" and stop_reason(records[:2]) == "terminated"
    bad = StepRecord(index=7, action=Action(tool=LLM_CALL_TOOL), observation=Observation(),
                     info={"llm_call": {"index": "x"}})  # fmt: skip
    with pytest.raises(TraceError, match="step 7: not an LlmCall record"):
        llm_calls([bad])


class RecordedHarnessClient(AsyncClient):
    """A test double of the client: each reset plays the next recorded episode (its step
    records and verdict); records what the collector asked for."""

    def __init__(self, episodes: list[tuple[list[StepRecord], Verdict]], refuse: int = 0) -> None:
        self.episodes = episodes
        self.refuse = refuse  # answer resets with this HTTP status
        self.resets: list[ResetRequest] = []
        self.played: dict[str, tuple[list[StepRecord], Verdict]] = {}
        self.closed: list[str] = []

    async def _reset(self, request: ResetRequest) -> ResetResponse:
        if self.refuse:
            body = {"error": {"code": "missing_scope", "message": "needs scope harness"}}
            raise error_from_response(self.refuse, body, None)
        self.resets.append(request)
        eid = request.episode_id or f"ep{len(self.resets)}"
        self.played[eid] = self.episodes[(len(self.resets) - 1) % len(self.episodes)]
        await asyncio.sleep(0)
        return ResetResponse(episode_id=eid, observation=Observation(), tools=[], limits=Limits())

    async def verify(self, episode_id: str) -> Verdict:
        await asyncio.sleep(0.01)  # the harness runs
        return self.played[episode_id][1]

    async def state(self, episode_id: str) -> EpisodeState:
        records, verdict = self.played[episode_id]
        now = time.time()
        return EpisodeState(episode_id=episode_id, task="t", family="coding", status="done",
                            step_count=len(records), created_at=now, updated_at=now,
                            trajectory=records, verdict=verdict)  # fmt: skip

    async def close(self, episode_id: str) -> None:
        self.closed.append(episode_id)


def verdict(reward: float, status: str = "ok") -> Verdict:
    return Verdict(reward=reward, passed=reward == 1.0, status=status,  # type: ignore[arg-type]
                   verifier=VerifierInfo(name="v", version="1"))  # fmt: skip


def test_collector_groups_harness_episodes(tok: Any, tmp_path: Path) -> None:
    calls, _ = conversation(tok)
    edited = [record(k, c) for k, c in enumerate(calls)]  # two samples
    plain = [record(0, calls[0]), record(1, calls[1]), record(2)]  # one sample
    episodes = [(edited, verdict(1.0)), (plain, verdict(0.0)), ([], verdict(0.0)),
                (plain, verdict(0.0, "void")), (plain, verdict(0.0))]  # fmt: skip
    client = RecordedHarnessClient(episodes)
    config = CollectorConfig(group_size=3, batch_routes=False, reset_options={"x": 1})
    collector = HarnessCollector(client, HARNESS, ["org/p:t1"], config, seed=5)

    async def go() -> Any:
        groups = await collector.collect(1)
        await collector.drain()
        return groups

    [group] = asyncio.run(go())
    options = client.resets[0].options
    assert options["x"] == 1 and options["harness"]["name"] == "bash-agent"
    assert options["harness"]["model_endpoint"] == "http://127.0.0.1:9/v1"
    assert len(client.resets) == 5  # the empty and the void episode were refilled
    assert collector.stats["broken:no_model_calls"] == 1 and collector.stats["broken:void"] == 1
    assert collector.stats["samples"] == 4 and collector.stats["context_edits"] == 1
    assert len(group.trajectories) == 4 and group.rewards == [1.0, 0.0, 0.0]
    assert sorted(client.closed) == sorted(client.played)  # every episode freed
    from palaestra.sdk.train.grpo import group_advantages

    kept, zero = group_advantages([group])
    assert zero == 0 and len(kept) == 4
    mean = 1 / 3
    assert [t.advantage for t in kept] == pytest.approx([1 - mean, 1 - mean, -mean, -mean])


def test_collector_raises_what_the_server_refuses() -> None:
    client = RecordedHarnessClient([], refuse=403)
    config = CollectorConfig(group_size=2, batch_routes=False)
    collector = HarnessCollector(client, HARNESS, ["org/p:t1"], config)
    with pytest.raises(Exception, match="needs scope harness"):
        asyncio.run(collector.collect(1))
    with pytest.raises(Exception, match="name"):
        HarnessCollector(client, {"model_endpoint": "u", "model": "m"}, ["t"], config)
