"""Episodes and eval attempts as ATIF trajectories, and back (docs/integrations.md, "ATIF").

One step record is one ATIF step, so a round trip keeps every step. What ATIF has a slot
for goes there, for any ATIF reader: an action is the step's one tool call and its
observation the call's result (images as `data:` URLs); a harness model call is an agent
step with the reply's text and tool calls, and its token ids and logprobs in `metrics`
(`prompt_token_ids`, `completion_token_ids`, `logprobs`); the harness's end is a system
step. The rest of each record (reward, flags, info, timings, request id) sits in the step's
`extra.palaestra`, and the episode's state (task, status, verdict, metrics) in the root
`extra.palaestra`, so an import rebuilds the records exactly: nothing is kept twice but the
text a reader needs (a model call's reply stays whole in its record; its ids live only in
`metrics`). A trajectory palaestra did not write imports too, by the slots alone: an agent
step's metrics with ids become a model call record, each tool call an action record.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

import palaestra
from palaestra.sdk.atif_models import (
    ATIF_V18,
    VERSIONS,
    AtifError,
    Step,
    Trajectory,
    path_of,
    validate,
)
from palaestra.sdk.harness import LLM_CALL_TOOL
from palaestra.sdk.models import EpisodeState, EpisodeStatus, Observation, StepRecord

FORMAT = "palaestra-atif/1"  # the layout of our `extra.palaestra`, so a later one can tell
KEY = "palaestra"
HARNESS_END_TOOL = "harness_end"  # server/harness/runner.py END_TOOL: the harness's end
IDS = ("prompt_token_ids", "completion_token_ids", "logprobs")  # in metrics, not twice
PNG_URL = "data:image/png;base64,"


# -- episodes ------------------------------------------------------------------------------
def episode_to_atif(state: EpisodeState, version: str = ATIF_V18) -> dict[str, Any]:
    """`state` (with its trajectory) as an ATIF document of `version`, checked valid."""
    if version not in VERSIONS:
        raise ValueError(f"ATIF version {version!r}: palaestra writes {', '.join(VERSIONS)}")
    steps = [_record_step(r, i + 1) for i, r in enumerate(state.trajectory)] or [
        _no_steps(f"episode {state.episode_id} ended ({state.status.value}) before a step")
    ]
    calls = [r.info["llm_call"] for r in state.trajectory if _llm_call(r) is not None]
    agent: dict[str, Any] = {"name": "palaestra", "version": palaestra.__version__}
    model = next((s["model_name"] for s in steps if "model_name" in s), None)
    if model is not None:
        agent["model_name"] = model
    harness = _harness_name(state)
    if harness is not None:
        agent["extra"] = {"harness": harness}
    final: dict[str, Any] = {"total_steps": len(steps), "extra": _outcome(state)}
    if calls:
        final["total_prompt_tokens"] = sum(_tokens(c, "prompt") for c in calls)
        final["total_completion_tokens"] = sum(_tokens(c, "completion") for c in calls)
    # A sealed verifier's own words (admin reads only) never go into a file that travels.
    episode = state.model_dump(mode="json", exclude={"trajectory", "sealed_feedback"})
    document = {
        "schema_version": version,
        "session_id": state.episode_id,
        "trajectory_id": state.episode_id,
        "agent": agent,
        "steps": steps,
        "notes": f"palaestra episode {state.episode_id} of {state.task}",
        "final_metrics": final,
        "extra": {KEY: {"format": FORMAT, "kind": "episode", "episode": episode}},
    }
    return validate(document).to_json_dict()


def atif_to_episode(document: Any) -> EpisodeState:
    """An ATIF document as an episode: ours exactly as exported, another's by its slots.
    AtifError names the step and field of anything that is not valid."""
    trajectory = validate(document)
    ours = _ours(trajectory, "episode")
    if ours is None:
        return _foreign(trajectory)
    records = [_record(step, i) for i, step in enumerate(_with_records(trajectory))]
    episode = ours.get("episode")
    if not isinstance(episode, dict):
        raise AtifError([f"extra.{KEY}.episode: the episode's state is missing"])
    try:
        return EpisodeState.model_validate({**episode, "trajectory": records})
    except ValidationError as exc:
        raise AtifError(_problems(exc, f"extra.{KEY}.episode.")) from None


def kind_of(document: Any) -> str:
    """`episode` or `eval_attempt` (our exports), else `foreign`; validates first."""
    trajectory = validate(document)
    ours = (trajectory.extra or {}).get(KEY)
    if isinstance(ours, dict) and ours.get("kind") in ("episode", "eval_attempt"):
        return str(ours["kind"])
    return "foreign"


def _no_steps(why: str) -> dict[str, Any]:
    """The one step of a trajectory with no records: ATIF (Harbor's models) needs a step."""
    return {"step_id": 1, "source": "system", "message": why, "extra": {KEY: {"no_steps": True}}}


def _with_records(trajectory: Trajectory) -> list[Step]:
    """The steps that hold records: none where the one step says there are none."""
    steps = trajectory.steps
    if len(steps) == 1 and (steps[0].extra or {}).get(KEY) == {"no_steps": True}:
        return []
    return steps


def _record_step(r: StepRecord, step_id: int) -> dict[str, Any]:
    extra: dict[str, Any] = {
        "index": r.index,
        "request_id": r.request_id,
        "reward": r.reward,
        "terminated": r.terminated,
        "truncated": r.truncated,
        "info": r.info,
        "duration_s": r.duration_s,
        "at": r.at,
    }
    step: dict[str, Any] = {"step_id": step_id}
    if r.at > 0:
        step["timestamp"] = datetime.fromtimestamp(r.at, UTC).isoformat().replace("+00:00", "Z")
    result: dict[str, Any] = {"content": _content(r.observation)}
    if r.observation.data:
        result["extra"] = {"data": r.observation.data}
    call = _llm_call(r)
    if call is not None:
        step.update(_llm_step(call, r.index))
        extra["action"] = r.action.model_dump(mode="json")
        moved = {k: _moved(k) if k in IDS and isinstance(v, list) else v for k, v in call.items()}
        extra["info"] = {**r.info, "llm_call": moved}
    elif r.action.tool == HARNESS_END_TOOL:
        harness = r.info.get("harness")
        state = harness.get("state") if isinstance(harness, dict) else None
        step.update(source="system", message=f"the harness ended ({state or 'unknown'})")
        extra["action"] = r.action.model_dump(mode="json")
    else:
        call_id = f"call_{r.index}"
        tool_call = {
            "tool_call_id": call_id,
            "function_name": r.action.tool,
            "arguments": r.action.arguments,
        }
        step.update(source="agent", message="", tool_calls=[tool_call])
        result["source_call_id"] = call_id
    step["observation"] = {"results": [result]}
    step["extra"] = {KEY: extra}
    return step


def _record(step: Step, i: int) -> StepRecord:
    """Step `i` of our export back into its record."""
    here = f"steps[{i}]"
    x = (step.extra or {}).get(KEY)
    if not isinstance(x, dict):
        raise AtifError(
            [f"{here}.extra.{KEY}: missing; a palaestra export keeps each record there"]
        )
    data = {k: v for k, v in x.items() if k != "action"}
    if "action" in x:
        data["action"] = x["action"]
    elif step.tool_calls:
        first = step.tool_calls[0]
        data["action"] = {"tool": first.function_name, "arguments": first.arguments}
    else:
        raise AtifError([f"{here}.tool_calls: missing; the step's action is its tool call"])
    results = step.observation.results if step.observation else []
    if not results:
        raise AtifError([f"{here}.observation.results: missing; the record's observation is there"])
    data["observation"] = _observation(
        results[0].content, results[0].extra, f"{here}.observation.results[0]"
    )
    info = data.get("info")
    call = info.get("llm_call") if isinstance(info, dict) else None
    if isinstance(info, dict) and isinstance(call, dict):
        ids = {}
        for k in IDS:
            if call.get(k) == _moved(k):
                value = getattr(step.metrics, k) if step.metrics is not None else None
                if value is None:
                    raise AtifError([f"{here}.metrics.{k}: missing; the model call's are there"])
                ids[k] = value
        data["info"] = {**info, "llm_call": {**call, **ids}}
    try:
        return StepRecord.model_validate(data)
    except ValidationError as exc:
        raise AtifError(_problems(exc, f"{here}.extra.{KEY}.")) from None


def _moved(key: str) -> str:
    """What a model call's record holds in place of ids it keeps in the step's metrics."""
    return f"(in metrics.{key})"


def _llm_call(r: StepRecord) -> dict[str, Any] | None:
    call = r.info.get("llm_call") if r.action.tool == LLM_CALL_TOOL else None
    return call if isinstance(call, dict) else None


def _llm_step(call: dict[str, Any], index: int) -> dict[str, Any]:
    """A model call's agent step: the reply's text and tool calls, the ids in metrics."""
    text, reasoning, tool_calls = _reply(call.get("api"), call.get("response"), index)
    step: dict[str, Any] = {"source": "agent", "message": text, "llm_call_count": 1}
    request = call.get("request")
    model = request.get("model") if isinstance(request, dict) else None
    if isinstance(model, str):
        step["model_name"] = model
    if reasoning:
        step["reasoning_content"] = reasoning
    if tool_calls:
        step["tool_calls"] = tool_calls
    metrics: dict[str, Any] = {
        "prompt_tokens": _tokens(call, "prompt"),
        "completion_tokens": _tokens(call, "completion"),
    }
    metrics.update({k: call[k] for k in IDS if isinstance(call.get(k), list)})
    step["metrics"] = metrics
    return step


def _reply(api: Any, response: Any, index: int) -> tuple[str, str, list[dict[str, Any]]]:
    """(text, reasoning, tool calls) of a reply in the OpenAI chat, Anthropic or Open
    Responses shape."""
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[tuple[Any, Any, Any]] = []  # (id, name, arguments)
    response = response if isinstance(response, dict) else {}
    if api == "openresponses":
        for item in response.get("output") or []:
            kind = item.get("type") if isinstance(item, dict) else None
            if kind == "function_call":
                calls.append((item.get("call_id"), item.get("name"), item.get("arguments")))
            elif kind in ("message", "reasoning"):
                into = texts if kind == "message" else reasoning
                into += [p["text"] for p in item.get("content") or []
                         if isinstance(p, dict) and isinstance(p.get("text"), str)]  # fmt: skip
    elif api == "anthropic-messages":
        for block in response.get("content") or []:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "text" and isinstance(block.get("text"), str):
                texts.append(block["text"])
            elif block.get("type") == "thinking" and isinstance(block.get("thinking"), str):
                reasoning.append(block["thinking"])
            elif block.get("type") == "tool_use":
                calls.append((block.get("id"), block.get("name"), block.get("input")))
    else:
        choices = response.get("choices") or [{}]
        message = choices[0].get("message") if isinstance(choices[0], dict) else None
        message = message if isinstance(message, dict) else {}
        content = message.get("content")
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            texts += [
                p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
            ]
        for key in ("reasoning_content", "reasoning"):
            if isinstance(message.get(key), str):
                reasoning.append(message[key])
                break
        for tc in message.get("tool_calls") or []:
            fn = tc.get("function") if isinstance(tc, dict) else None
            if isinstance(fn, dict):
                calls.append((tc.get("id"), fn.get("name"), fn.get("arguments")))
    out = []
    for j, (call_id, name, arguments) in enumerate(calls):
        tool_call: dict[str, Any] = {
            "tool_call_id": call_id if isinstance(call_id, str) else f"call_{index}_{j}",
            "function_name": name if isinstance(name, str) else "",
            "arguments": {},
        }
        parsed = arguments
        if isinstance(arguments, str):
            try:
                parsed = json.loads(arguments)
            except json.JSONDecodeError:
                parsed = None
        if isinstance(parsed, dict):
            tool_call["arguments"] = parsed
        elif arguments is not None:
            tool_call["extra"] = {"arguments": arguments}  # not a JSON object: kept as sent
        out.append(tool_call)
    return "".join(texts), "".join(reasoning), out


def _tokens(call: dict[str, Any], which: str) -> int:
    usage = call.get("usage")
    counted = usage.get(f"{which}_tokens") if isinstance(usage, dict) else None
    ids = call.get(f"{which}_token_ids")
    return counted if isinstance(counted, int) else len(ids) if isinstance(ids, list) else 0


def _content(observation: Observation) -> str | list[dict[str, Any]]:
    if not observation.images:
        return observation.text
    parts: list[dict[str, Any]] = [{"type": "text", "text": observation.text}]
    for image in observation.images:
        parts.append(
            {"type": "image", "source": {"media_type": "image/png", "path": PNG_URL + image}}
        )
    return parts


def _observation(content: Any, extra: dict[str, Any] | None, at: str) -> dict[str, Any]:
    """A result's content (and `extra.data`) as an observation: text, then PNG images."""
    data = (extra or {}).get("data", {})
    if content is None or isinstance(content, str):
        return {"text": content or "", "data": data}
    text, images = [], []
    for j, part in enumerate(content):
        if part.type == "text":
            text.append(part.text or "")
        elif (
            part.type == "image"
            and part.source is not None
            and part.source.path.startswith(PNG_URL)
        ):
            images.append(part.source.path[len(PNG_URL) :])
        else:
            raise AtifError(
                [f"{at}.content[{j}]: palaestra observations hold text and inline PNG images only"]
            )
    return {"text": "".join(text), "images": images, "data": data}


def _harness_name(state: EpisodeState) -> str | None:
    if state.harness is not None:
        return state.harness.name
    for r in reversed(state.trajectory):
        harness = r.info.get("harness") if r.action.tool == HARNESS_END_TOOL else None
        if isinstance(harness, dict) and isinstance(harness.get("name"), str):
            return str(harness["name"])
    return None


def _outcome(state: EpisodeState) -> dict[str, Any]:
    out: dict[str, Any] = {"status": state.status.value}
    if state.verdict is not None:
        out.update(reward=state.verdict.reward, passed=state.verdict.passed)
    return out


def _ours(trajectory: Trajectory, kind: str) -> dict[str, Any] | None:
    """The root `extra.palaestra` of our export of `kind`; None for another's trajectory."""
    ours = (trajectory.extra or {}).get(KEY)
    if not isinstance(ours, dict):
        return None
    if ours.get("format") != FORMAT:
        raise AtifError([f"extra.{KEY}.format: {ours.get('format')!r} is not {FORMAT!r}"])
    if ours.get("kind") != kind:
        raise AtifError([f"extra.{KEY}.kind: {ours.get('kind')!r}, expected {kind!r}"])
    return ours


def _problems(exc: ValidationError, prefix: str) -> list[str]:
    return [f"{prefix}{path_of(e['loc'])}: {e['msg']}" for e in exc.errors(include_url=False)]


def _foreign(trajectory: Trajectory) -> EpisodeState:
    """Another producer's trajectory, by ATIF's slots: per agent step, a model call record
    where its metrics hold ids (or it counts LLM calls), then one record per tool call with
    the result that names it. User and system steps are prompts, not records."""
    records: list[StepRecord] = []
    times = [_epoch(s.timestamp) for s in trajectory.steps if s.timestamp]
    for step in trajectory.steps:
        if step.source != "agent":
            continue
        at = _epoch(step.timestamp) if step.timestamp else 0.0
        m = step.metrics
        if (m is not None and m.completion_token_ids is not None) or (step.llm_call_count or 0) > 0:
            records.append(
                _foreign_call(step, len(records), sum(1 for r in records if _llm_call(r)), at)
            )
        results = step.observation.results if step.observation else []
        for call in step.tool_calls or []:
            found = next((r for r in results if r.source_call_id == call.tool_call_id), None)
            observation = (
                _observation(found.content, found.extra, f"steps[{step.step_id - 1}]")
                if found is not None
                else {"text": ""}
            )
            records.append(
                StepRecord.model_validate(
                    {
                        "index": len(records),
                        "action": {
                            "tool": call.function_name or "unnamed",
                            "arguments": call.arguments,
                        },
                        "observation": observation,
                        "at": at,
                    }
                )
            )
    episode_id = trajectory.session_id or trajectory.trajectory_id or "atif-import"
    return EpisodeState(
        episode_id=episode_id,
        task="",
        family="",
        status=EpisodeStatus.CLOSED,
        step_count=len(records),
        created_at=min(times, default=0.0),
        updated_at=max(times, default=0.0),
        trajectory=records,
    )


def _foreign_call(step: Step, index: int, call_index: int, at: float) -> StepRecord:
    m = step.metrics
    message = (
        step.message
        if isinstance(step.message, str)
        else "".join(p.text or "" for p in step.message if p.type == "text")
    )
    calls = [
        {
            "id": c.tool_call_id,
            "type": "function",
            "function": {"name": c.function_name, "arguments": json.dumps(c.arguments)},
        }
        for c in step.tool_calls or []
    ]
    reply: dict[str, Any] = {"role": "assistant", "content": message}
    if calls:
        reply["tool_calls"] = calls
    usage = {
        k: v
        for k, v in (
            ("prompt_tokens", m and m.prompt_tokens),
            ("completion_tokens", m and m.completion_tokens),
        )
        if isinstance(v, int)
    }
    call = {
        "index": call_index,
        "api": "openai-chat",
        "request": {"model": step.model_name} if step.model_name else {},
        "response": {"choices": [{"message": reply}]},
        "prompt_token_ids": (m.prompt_token_ids if m else None) or [],
        "completion_token_ids": (m.completion_token_ids if m else None) or [],
        "logprobs": (m.logprobs if m else None) or [],
        "usage": usage,
        "started_at": at,
        "upstream_s": 0.0,
        "proxy_s": 0.0,
    }
    return StepRecord.model_validate(
        {
            "index": index,
            "action": {"tool": LLM_CALL_TOOL, "arguments": {}},
            "observation": {"text": ""},
            "info": {"llm_call": call},
            "at": at,
        }
    )


def _epoch(timestamp: str) -> float:
    moment = datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


# -- eval attempts -------------------------------------------------------------------------
def attempt_to_atif(
    attempt: dict[str, Any], manifest: dict[str, Any], line: int, version: str = ATIF_V18
) -> dict[str, Any]:
    """One line of a run's attempts.jsonl (`line`, from 0) as an ATIF document; the run's
    manifest travels with it, so a directory of these rebuilds the run."""
    if version not in VERSIONS:
        raise ValueError(f"ATIF version {version!r}: palaestra writes {', '.join(VERSIONS)}")
    entries = attempt.get("trajectory") or []
    steps = [_entry_step(e, i + 1) for i, e in enumerate(entries)] or [
        _no_steps(f"the attempt ended before a step: {attempt.get('error') or attempt.get('stop')}")
    ]
    found = manifest.get("policy")
    policy: dict[str, Any] = found if isinstance(found, dict) else {}
    agent: dict[str, Any] = {
        "name": f"palaestra-eval/{policy.get('kind', 'policy')}",
        "version": str(manifest.get("palaestra_version", palaestra.__version__)),
    }
    if policy.get("model"):
        agent["model_name"] = str(policy["model"])
    ident = attempt.get("episode_id") or f"{attempt.get('task')}#{attempt.get('attempt')}"
    rest = {k: v for k, v in attempt.items() if k != "trajectory"}
    document = {
        "schema_version": version,
        "session_id": manifest.get("run_id") or ident,
        "trajectory_id": ident,
        "agent": agent,
        "steps": steps,
        "notes": f"palaestra eval run {manifest.get('run_id', '')}: {attempt.get('task')} "
        f"attempt {attempt.get('attempt')}",
        "final_metrics": {
            "total_prompt_tokens": attempt.get("tokens_prompt", 0),
            "total_completion_tokens": attempt.get("tokens_completion", 0),
            "total_steps": len(steps),
            "extra": {k: attempt.get(k) for k in ("status", "reward", "passed")},
        },
        "extra": {
            KEY: {
                "format": FORMAT,
                "kind": "eval_attempt",
                "line": line,
                "attempt": rest,
                "run": manifest,
            }
        },
    }
    return validate(document).to_json_dict()


def atif_to_attempt(document: Any) -> tuple[dict[str, Any], dict[str, Any], int]:
    """(attempt, run manifest, line) of our export of one eval attempt."""
    trajectory = validate(document)
    ours = _ours(trajectory, "eval_attempt")
    if ours is None:
        raise AtifError([f"extra.{KEY}: missing; not a palaestra eval attempt"])
    attempt, manifest, line = ours.get("attempt"), ours.get("run"), ours.get("line")
    if not isinstance(attempt, dict) or not isinstance(manifest, dict) or not isinstance(line, int):
        raise AtifError([f"extra.{KEY}: needs `attempt` and `run` objects and a `line` number"])
    entries = [_entry(step, i) for i, step in enumerate(_with_records(trajectory))]
    return {**attempt, "trajectory": entries}, manifest, line


def _entry_step(entry: dict[str, Any], step_id: int) -> dict[str, Any]:
    """One entry of an attempt's stored trajectory (action, observation text, reward,
    timings; cli/eval): the action as the tool call, the text as its result."""
    rest = dict(entry)
    moved: list[str] = []
    step: dict[str, Any] = {"step_id": step_id, "source": "agent", "message": ""}
    call_id = f"call_{entry.get('index', step_id - 1)}"
    action = entry.get("action")
    if (
        isinstance(action, dict)
        and isinstance(action.get("tool"), str)
        and isinstance(action.get("arguments", {}), dict)
        and set(action) <= {"tool", "arguments"}
    ):
        step["tool_calls"] = [
            {
                "tool_call_id": call_id,
                "function_name": action["tool"],
                "arguments": action.get("arguments", {}),
            }
        ]
        moved.append("action")
        rest.pop("action")
        if "arguments" not in action:
            moved.append("action.no_arguments")
    observation = entry.get("observation")
    result: dict[str, Any] | None = None
    if isinstance(observation, dict) and isinstance(observation.get("text"), str):
        result = {"content": observation["text"]}
        rest["observation"] = {k: v for k, v in observation.items() if k != "text"}
        moved.append("observation.text")
    elif isinstance(entry.get("error"), str):
        result = {"content": f"error: {entry['error']}"}  # the refusal, as the policy saw it
    if result is not None:
        if "tool_calls" in step:
            result["source_call_id"] = call_id
        step["observation"] = {"results": [result]}
    step["extra"] = {KEY: {"entry": rest, "moved": moved, "order": list(entry)}}
    return step


def _entry(step: Step, i: int) -> dict[str, Any]:
    x = (step.extra or {}).get(KEY)
    if not isinstance(x, dict) or not isinstance(x.get("entry"), dict):
        raise AtifError([f"steps[{i}].extra.{KEY}.entry: missing; the attempt's entry is there"])
    entry, moved = dict(x["entry"]), x.get("moved") or []
    if "action" in moved:
        if not step.tool_calls:
            raise AtifError(
                [f"steps[{i}].tool_calls: missing; the entry's action is its tool call"]
            )
        call = step.tool_calls[0]
        entry["action"] = {"tool": call.function_name, "arguments": call.arguments}
        if "action.no_arguments" in moved:
            del entry["action"]["arguments"]
    if "observation.text" in moved:
        results = step.observation.results if step.observation else []
        content = results[0].content if results else None
        if not isinstance(content, str):
            raise AtifError(
                [f"steps[{i}].observation.results[0].content: the observation's text is missing"]
            )
        entry["observation"] = {"text": content, **(entry.get("observation") or {})}
    order = [k for k in x.get("order") or [] if k in entry]  # the line's bytes, as they were
    return {**{k: entry[k] for k in order}, **entry}
