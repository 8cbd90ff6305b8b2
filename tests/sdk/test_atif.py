"""sdk/atif.py without a server: every kind of step record through ATIF-v1.7 and v1.8 and
back, each document validated by the `atif` package's own models (the other side's
validator) and, in the slow tier, Harbor's; eval attempts likewise; another producer's
trajectory by ATIF's slots; and bad files refused naming the step and field, where the
`atif` package refuses them too. (tests/cli/test_atif_cli.py: a real server's episodes.)"""

from __future__ import annotations

import copy
import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import atif
import pydantic
import pytest

from palaestra.sdk.atif import (
    atif_to_attempt,
    atif_to_episode,
    attempt_to_atif,
    episode_to_atif,
    kind_of,
)
from palaestra.sdk.atif_models import ATIF_V17, ATIF_V18, AtifError
from palaestra.sdk.harness import HarnessStatus, LlmCall
from palaestra.sdk.models import (
    Action,
    EpisodeState,
    EpisodeStatus,
    Observation,
    StepRecord,
    Verdict,
    VerifierInfo,
)
from palaestra.sdk.train.harness import episode_samples
from tests.envs.terminal.test_harbor import _harbor_python

VERSIONS = (ATIF_V17, ATIF_V18)
PNG = (  # one transparent pixel
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
)


def openai_call(index: int) -> LlmCall:
    arguments = json.dumps({"command": "ls -la"})
    message = {
        "role": "assistant",
        "content": "Let me look.",
        "reasoning_content": "The workspace first.",
        "tool_calls": [{"id": "call_a", "type": "function",
                        "function": {"name": "bash", "arguments": arguments}},
                       {"id": "call_b", "type": "function",
                        "function": {"name": "note", "arguments": "not json"}}],
    }  # fmt: skip
    return LlmCall(
        index=index,
        api="openai-chat",
        request={"model": "policy", "messages": [{"role": "user", "content": "Fix it."}]},
        response={"choices": [{"message": message, "finish_reason": "tool_calls"}]},
        prompt_token_ids=[101, 102, 103, 104],
        completion_token_ids=[7, 8, 9],
        logprobs=[-0.25, -1.5, -0.0078125],
        finish_reason="tool_calls",
        usage={"prompt_tokens": 4, "completion_tokens": 3},
        started_at=1_796_000_000.25,
        upstream_s=0.125,
        proxy_s=0.130_000_1,
    )


def anthropic_call(index: int) -> LlmCall:
    content = [
        {"type": "thinking", "thinking": "Submit now."},
        {"type": "text", "text": "Done."},
        {"type": "tool_use", "id": "toolu_1", "name": "submit", "input": {}},
    ]
    return LlmCall(
        index=index,
        api="anthropic-messages",
        request={"model": "policy", "max_tokens": 64, "messages": []},
        response={"content": content, "stop_reason": "tool_use"},
        prompt_token_ids=[1, 2],
        completion_token_ids=[3],
        logprobs=[-0.5],
        started_at=1_796_000_001.5,
        upstream_s=0.01,
        proxy_s=0.02,
        stream=True,
    )


def refused_call(index: int) -> LlmCall:
    return LlmCall(
        index=index,
        api="openai-chat",
        request={"head": '{"model": "policy", "messages": [', "truncated": "[truncated: 9 bytes]"},
        response={"error": {"message": "context too long"}},
        prompt_token_ids=[],
        completion_token_ids=[],
        logprobs=[],
        started_at=1_796_000_002.0,
        upstream_s=0.0,
        proxy_s=0.001,
        error="HTTP 400: context too long",
    )


def record(index: int, tool: str, text: str = "", **fields: Any) -> StepRecord:
    action = Action(tool=tool, arguments=fields.pop("arguments", {}))
    observation = Observation(
        text=text, images=fields.pop("images", []), data=fields.pop("data", {})
    )
    return StepRecord(index=index, action=action, observation=observation,
                      at=1_796_000_000.0 + index / 3, **fields)  # fmt: skip


def llm_record(index: int, call: LlmCall) -> StepRecord:
    text = f"model call {call.index}: {len(call.completion_token_ids)} completion tokens"
    return record(index, "llm_call", text, info={"llm_call": call.model_dump(mode="json")},
                  duration_s=call.proxy_s)  # fmt: skip


def episode() -> EpisodeState:
    """One of each kind of step record an episode holds."""
    harness = HarnessStatus(name="bash-agent", state="exited", calls=3, exit_code=0)
    trajectory = [
        record(0, "run_python", "3\n", arguments={"code": "print(1 + 2)"}, request_id="r-0",
               data={"exit_code": 0, "nested": {"a": [1, 2.5, None]}}, duration_s=0.0125),
        record(1, "render", "a picture", images=[PNG, PNG], reward=0.0),
        record(2, "echo", "", arguments={"text": "ünïcödé ✓"}, info={"tool_ok": False}),
        llm_record(3, openai_call(0)),
        llm_record(4, anthropic_call(1)),
        llm_record(5, refused_call(2)),
        record(6, "harness_end", "the harness exited 0", reward=1.0, terminated=True,
               info={"harness": harness.model_dump(mode="json"), "status": "done"}),
    ]  # fmt: skip
    verdict = Verdict(reward=1.0, passed=True, components={"tests": 1.0},
                      verifier=VerifierInfo(name="unit-tests", version="1.2.0"),
                      task_digest="sha256:" + "ab" * 32, duration_s=0.5)  # fmt: skip
    return EpisodeState(
        episode_id="ep-atif-1",
        task="openai/humaneval@1.0.0:HumanEval-2",
        family="coding",
        domain="coding/humaneval",
        split="train",
        status=EpisodeStatus.DONE,
        step_count=len(trajectory),
        created_at=1_796_000_000.0,
        updated_at=1_796_000_003.0,
        ended_at=1_796_000_003.0,
        timings={"reset_s": 0.01},
        verdict=verdict,
        trajectory=trajectory,
    )


def through_text(document: dict[str, Any]) -> Any:
    """As a file would carry it."""
    return json.loads(json.dumps(document))


@pytest.mark.parametrize("version", VERSIONS)
def test_every_record_kind_round_trips(version: str) -> None:
    state = episode()
    document = through_text(episode_to_atif(state, version))
    checked = atif.Trajectory.model_validate(document)  # the other side's validator
    assert checked.schema_version == version
    assert len(checked.steps) == len(state.trajectory)
    assert kind_of(document) == "episode"
    back = atif_to_episode(document)
    assert back == state
    for ours, theirs in zip(back.trajectory, state.trajectory, strict=True):
        assert ours.model_dump_json() == theirs.model_dump_json()  # every step, byte for byte


def test_readers_find_the_standard_slots() -> None:
    document = atif.Trajectory.model_validate(through_text(episode_to_atif(episode())))
    action, picture, _, openai, anthropic, refused, end = document.steps
    assert action.source == "agent" and action.tool_calls is not None
    assert action.tool_calls[0].function_name == "run_python"
    assert action.tool_calls[0].arguments == {"code": "print(1 + 2)"}
    assert action.observation is not None
    assert action.observation.results[0].source_call_id == action.tool_calls[0].tool_call_id
    assert action.observation.results[0].content == "3\n"
    assert action.timestamp is not None and action.timestamp.endswith("Z")
    assert picture.observation is not None
    parts = picture.observation.results[0].content
    assert isinstance(parts, list) and [p.type for p in parts] == ["text", "image", "image"]
    # A harness model call: the reply's text, reasoning and tool calls, the ids in metrics.
    assert openai.message == "Let me look." and openai.reasoning_content == "The workspace first."
    assert openai.model_name == "policy" and openai.llm_call_count == 1
    assert openai.tool_calls is not None
    assert [(c.tool_call_id, c.function_name) for c in openai.tool_calls] == [
        ("call_a", "bash"),
        ("call_b", "note"),
    ]
    assert openai.tool_calls[0].arguments == {"command": "ls -la"}
    assert openai.tool_calls[1].extra == {"arguments": "not json"}
    assert openai.metrics is not None
    assert openai.metrics.prompt_token_ids == [101, 102, 103, 104]
    assert openai.metrics.completion_token_ids == [7, 8, 9]
    assert openai.metrics.logprobs == [-0.25, -1.5, -0.0078125]
    assert (openai.metrics.prompt_tokens, openai.metrics.completion_tokens) == (4, 3)
    assert anthropic.message == "Done." and anthropic.reasoning_content == "Submit now."
    assert anthropic.tool_calls is not None and anthropic.tool_calls[0].function_name == "submit"
    assert refused.metrics is not None and refused.metrics.completion_token_ids == []
    assert end.source == "system" and end.tool_calls is None
    assert document.agent.model_name == "policy"
    assert document.agent.extra == {"harness": "bash-agent"}
    assert document.final_metrics is not None
    assert document.final_metrics.total_completion_tokens == 3 + 1 + 0
    assert document.final_metrics.extra == {"status": "done", "reward": 1.0, "passed": True}
    # The ids live in metrics only: the record in extra says where they are.
    assert openai.extra is not None
    kept = openai.extra["palaestra"]["info"]["llm_call"]
    assert kept["prompt_token_ids"] == "(in metrics.prompt_token_ids)"
    assert "101" not in json.dumps(openai.extra)


def test_an_open_responses_call_finds_the_same_slots() -> None:
    """A call of the Responses door (api `openresponses`): its output items' text,
    reasoning and function calls, the ids in metrics; it round-trips."""
    output = [
        {"type": "reasoning", "id": "rs_1", "summary": [],
         "content": [{"type": "reasoning_text", "text": "Look first."}]},
        {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
         "content": [{"type": "output_text", "text": "Listing.", "annotations": []}]},
        {"type": "function_call", "id": "fc_1", "call_id": "call_r", "name": "bash",
         "arguments": '{"command": "ls"}', "status": "completed"},
    ]  # fmt: skip
    call = anthropic_call(0).model_copy(update={
        "api": "openresponses", "request": {"model": "policy", "input": "hi"},
        "response": {"object": "response", "output": output}})  # fmt: skip
    state = episode()
    state.trajectory[4] = llm_record(4, call)
    document = through_text(episode_to_atif(state))
    step = atif.Trajectory.model_validate(document).steps[4]
    assert step.message == "Listing." and step.reasoning_content == "Look first."
    assert step.tool_calls is not None and step.tool_calls[0].tool_call_id == "call_r"
    assert step.tool_calls[0].arguments == {"command": "ls"}
    assert step.metrics is not None and step.metrics.completion_token_ids == [3]
    assert atif_to_episode(document) == state


def attempt() -> tuple[dict[str, Any], dict[str, Any]]:
    entries = [
        {"index": 0, "action": {"tool": "echo", "arguments": {"text": "hi"}}, "policy_s": 0.5,
         "tokens": 12, "error": "unknown tool 'echo'", "env_s": 0.001},
        {"index": 1, "action": {"tool": "submit", "arguments": {"answer": "ih"}},
         "policy_s": 0.25, "tokens": 30, "observation": {"text": "submitted", "images": 0},
         "reward": 1.0, "terminated": True, "truncated": False, "env_s": 0.002,
         "accepted": True},
    ]  # fmt: skip
    line = {"task": "palaestra/echo@0.1.0:say-hi", "attempt": 1, "seed": 1, "episode_id": "e9",
            "status": "ok", "reward": 1.0, "passed": True, "tokens_prompt": 30,
            "tokens_completion": 12, "trajectory": entries}  # fmt: skip
    manifest = {"format": "palaestra-run/1", "run_id": "r1", "policy": {"kind": "chat",
                "model": "qwen"}, "palaestra_version": "0.1.0"}  # fmt: skip
    return line, manifest


@pytest.mark.parametrize("version", VERSIONS)
def test_an_eval_attempt_round_trips(version: str) -> None:
    line, manifest = attempt()
    document = through_text(attempt_to_atif(line, manifest, 7, version))
    checked = atif.Trajectory.model_validate(document)
    assert checked.agent.model_name == "qwen" and len(checked.steps) == 2
    refused = checked.steps[0]
    assert refused.observation is not None
    assert refused.observation.results[0].content == "error: unknown tool 'echo'"
    assert kind_of(document) == "eval_attempt"
    back, run, number = atif_to_attempt(document)
    assert (back, run, number) == (line, manifest, 7)
    assert json.dumps(back) == json.dumps(line)  # key order too: the same attempts.jsonl line


README_EXAMPLE = {  # the `atif` package's own example: another producer's trajectory
    "schema_version": "ATIF-v1.8",
    "session_id": "s-1",
    "agent": {"name": "my-agent", "version": "1.0.0", "model_name": "m"},
    "steps": [
        {"step_id": 1, "source": "user", "message": "What time is it?"},
        {
            "step_id": 2,
            "timestamp": "2026-05-16T12:00:01Z",
            "source": "agent",
            "message": "Let me check.",
            "tool_calls": [{"tool_call_id": "c1", "function_name": "now", "arguments": {}}],
            "observation": {"results": [{"source_call_id": "c1", "content": "12:00"}]},
            "metrics": {
                "prompt_tokens": 3,
                "completion_tokens": 2,
                "prompt_token_ids": [1, 2, 3],
                "completion_token_ids": [4, 5],
                "logprobs": [-0.1, -0.2],
            },
        },
    ],
}


def test_another_producers_trajectory_imports_by_its_slots() -> None:
    atif.Trajectory.model_validate(README_EXAMPLE)
    assert kind_of(README_EXAMPLE) == "foreign"
    state = atif_to_episode(README_EXAMPLE)
    assert state.episode_id == "s-1" and state.status == EpisodeStatus.CLOSED
    call, action = state.trajectory
    llm = LlmCall.model_validate(call.info["llm_call"])
    assert (llm.prompt_token_ids, llm.completion_token_ids, llm.logprobs) == (
        [1, 2, 3],
        [4, 5],
        [-0.1, -0.2],
    )
    assert llm.usage == {"prompt_tokens": 3, "completion_tokens": 2}
    assert action.action == Action(tool="now") and action.observation.text == "12:00"
    (sample,) = episode_samples(state, reward=1.0)  # the trainer's harness tools read it
    assert (sample.prompt_ids, sample.completion_ids) == ([1, 2, 3], [4, 5])


def _drop(path: str) -> Callable[[dict[str, Any]], None]:
    def change(d: dict[str, Any]) -> None:
        *parents, last = path.split("/")
        node: Any = d
        for key in parents:
            node = node[int(key)] if key.isdigit() else node[key]
        del node[last]

    return change


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(d: dict[str, Any]) -> None:
        *parents, last = path.split("/")
        node: Any = d
        for key in parents:
            node = node[int(key)] if key.isdigit() else node[key]
        node[int(last) if last.isdigit() else last] = value

    return change


AUDIO = [{"type": "audio", "source": {"media_type": "audio/wav", "path": "a.wav"}}]
BAD = [  # (how the file is broken, the line the refusal must hold, whether `atif` refuses)
    (_drop("steps/0/tool_calls/0/function_name"),
     "steps[0].tool_calls[0].function_name: Field required", True),
    (_set("steps/3/step_id", 9), "steps[3].step_id: is 9, expected 4", True),
    (_set("steps/2/observation/results/0/source_call_id", "call_x"),
     "steps[2].observation.results[0].source_call_id: 'call_x' names no tool call", True),
    (_set("steps/6/model_name", "m"), "steps[6].model_name: only an agent step", True),
    (_set("steps/1/timestamp", "yesterday"), "steps[1].timestamp: 'yesterday' is not ISO", True),
    (_set("steps/4/surprise", 1), "steps[4].surprise: Extra inputs are not permitted", True),
    (_set("steps/3/llm_call_count", 0), "steps[3].metrics: must be absent", True),
    (_set("steps/3/metrics/logprobs", ["x"]), "steps[3].metrics.logprobs[0]:", True),
    (_set("steps/1/observation/results/0/content/1/text", "t"),
     "steps[1].observation.results[0].content[1]:", True),
    (_drop("agent"), "agent: Field required", True),
    (_set("steps", []), "steps: List should have at least 1 item", False),
    (_set("steps/5/message", AUDIO),
     "steps[5].message[0].type: audio parts came with ATIF-v1.8", False),
    (_set("schema_version", "ATIF-v1.6"), "schema_version: 'ATIF-v1.6' is not one", False),
    # Valid ATIF, but not a record palaestra can rebuild: named by the record's field.
    (_set("steps/2/extra/palaestra/reward", "lots"), "steps[2].extra.palaestra.reward:", False),
]  # fmt: skip


@pytest.mark.parametrize(("change", "names", "atif_refuses"), BAD)
def test_a_bad_file_is_refused_naming_step_and_field(
    change: Callable[[dict[str, Any]], None], names: str, atif_refuses: bool
) -> None:
    document = through_text(episode_to_atif(episode(), ATIF_V17))
    broken = copy.deepcopy(document)
    change(broken)
    with pytest.raises(AtifError) as refused:
        atif_to_episode(broken)
    assert any(p.startswith(names) for p in refused.value.problems), refused.value.problems
    if atif_refuses:  # the other side's validator agrees the file is not ATIF
        with pytest.raises(pydantic.ValidationError):
            atif.Trajectory.model_validate(broken)


def test_a_sealed_verifiers_own_words_stay_out() -> None:
    """An admin's read of an episode holds the sealed verifier's feedback; the file not."""
    state = episode().model_copy(update={"sealed_feedback": "expected 0.5, got 0.25"})
    document = episode_to_atif(state)
    assert "expected 0.5" not in json.dumps(document)
    assert atif_to_episode(through_text(document)) == episode()


def test_no_steps_is_one_system_step() -> None:
    """An episode closed before a step, an attempt void before one: ATIF (Harbor's models)
    asks for a step, so the file holds one saying so, and the import none."""
    empty = episode().model_copy(update={"trajectory": [], "step_count": 0})
    document = through_text(episode_to_atif(empty))
    (only,) = atif.Trajectory.model_validate(document).steps
    assert only.source == "system" and "before a step" in only.message
    assert atif_to_episode(document) == empty
    line, manifest = attempt()
    line = {**line, "trajectory": [], "status": "void", "error": "server unreachable"}
    document = through_text(attempt_to_atif(line, manifest, 0))
    assert "server unreachable" in atif.Trajectory.model_validate(document).steps[0].message
    assert atif_to_attempt(document) == (line, manifest, 0)


HARBOR_CHECK = """
import json, sys
from harbor.models.trajectories import Trajectory
for path in sys.argv[1:]:
    Trajectory.model_validate(json.load(open(path)))
print(len(sys.argv) - 1)
"""


@pytest.mark.slow
def test_harbors_own_models_accept_both_versions(tmp_path: Path) -> None:
    """Harbor's models (the `harbor` package, whose RFC ATIF is; its venv of its own) take
    each version by name, v1.7 as v1.7: every file we write passes them too."""
    python = _harbor_python()
    line, manifest = attempt()
    empty = episode().model_copy(update={"trajectory": [], "step_count": 0})
    paths = []
    for version in VERSIONS:
        documents = {
            "episode": episode_to_atif(episode(), version),
            "empty": episode_to_atif(empty, version),
            "attempt": attempt_to_atif(line, manifest, 0, version),
        }
        for name, document in documents.items():
            path = tmp_path / f"{name}-{version}.json"
            path.write_text(json.dumps(document))
            paths.append(str(path))
    checked = subprocess.run([str(python), "-c", HARBOR_CHECK, *paths], capture_output=True,
                             text=True, timeout=300)  # fmt: skip
    assert checked.returncode == 0, checked.stderr[-3000:]
    assert checked.stdout.split() == [str(len(paths))]


def test_writing_an_unknown_version_is_refused() -> None:
    with pytest.raises(ValueError, match=r"ATIF-v1\.6"):
        episode_to_atif(episode(), "ATIF-v1.6")
