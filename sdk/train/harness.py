"""Training from harness episodes: the proxy's records of model calls → token-in/token-out
`Trajectory` samples, and `HarnessCollector`, which runs harness episodes in groups.

In harness mode (docs/harness.md) the agent owns the loop; the episode's session proxy
records each model call as an `LlmCall` (sdk/harness.py): the prompt token ids, completion
token ids and logprobs exactly as the model server returned them. Nothing here
re-tokenizes: every id of a sample is an id the server reported.

The context-edit rule (`trajectories_from_calls`). Calls are walked in order. A call whose
`prompt_token_ids` start with the current sample's whole sequence (its prompt, then
everything after it) extends that sample: the ids in between — tool results, the
harness's own text, the chat template's glue — are environment tokens (mask 0), then the
call's completion ids are appended as sampled tokens (mask 1, the server's logprobs).
A call whose prompt does not start with it — the harness rewrote earlier turns
(truncation, a summary, a changed system prompt), or the server's chat template
re-rendered an earlier reply into other ids than it sampled — starts a new sample with
that call's prompt. Each sample of an episode carries the episode's reward; GRPO counts an
episode once however many samples it has (`Group.rewards`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from palaestra.sdk.client import AsyncClient
from palaestra.sdk.errors import ConflictError, NotFoundError, PalaestraError
from palaestra.sdk.harness import HARNESS_OPTION, LLM_CALL_TOOL, HarnessOptions, LlmCall
from palaestra.sdk.models import EpisodeState, EpisodeStatus, StepRecord
from palaestra.sdk.train.collector import CollectorConfig, EpisodeBroken, GroupCollector
from palaestra.sdk.train.types import StopReason, Trajectory


class TraceError(ValueError):
    """An episode's records cannot be turned into samples (a record that does not parse,
    ids and logprobs of different lengths): the trace is not trainable."""


# What `GET /v1/episodes/{id}` gives: the HTTP client's `EpisodeState`, or the JSON itself.
Episode = EpisodeState | Mapping[str, Any]
Records = Episode | Sequence[StepRecord | Mapping[str, Any]]


def episode_state(episode: Episode) -> EpisodeState:
    """The episode as `EpisodeState`, from the client's model or from the route's JSON."""
    if isinstance(episode, EpisodeState):
        return episode
    try:
        return EpisodeState.model_validate(episode)
    except ValidationError as exc:
        raise TraceError(f"not an episode as GET /v1/episodes/{{id}} returns it: {exc}") from None


def step_records(records: Records) -> list[StepRecord]:
    """An episode's step records: from the episode (`EpisodeState` or its JSON) or from
    its `trajectory` (records or their JSON)."""
    if isinstance(records, EpisodeState | Mapping):
        return list(episode_state(records).trajectory)
    parsed = []
    for k, record in enumerate(records):
        if isinstance(record, StepRecord):
            parsed.append(record)
            continue
        try:
            parsed.append(StepRecord.model_validate(record))
        except ValidationError as exc:
            raise TraceError(f"trajectory[{k}]: not a step record: {exc}") from None
    return parsed


def llm_calls(records: Records) -> list[LlmCall]:
    """The model calls among an episode's step records, in call order. `records`: what
    `GET /v1/episodes/{id}` returns (the client's `EpisodeState` or the JSON), or its
    trajectory."""
    calls = []
    for record in step_records(records):
        if record.action.tool != LLM_CALL_TOOL:
            continue
        raw = record.info.get("llm_call")
        try:
            calls.append(LlmCall.model_validate(raw))
        except ValidationError as exc:
            raise TraceError(f"step {record.index}: not an LlmCall record: {exc}") from None
    return sorted(calls, key=lambda c: c.index)


def stop_reason(records: Records) -> StopReason:
    """`truncated` when a record says a limit ended the episode, else `terminated`."""
    return "truncated" if any(r.truncated for r in step_records(records)) else "terminated"


@dataclass(frozen=True)
class SampleTags:
    """What every sample of one episode carries besides its tokens."""

    task: str = ""
    seed: int = 0
    group_id: int = 0
    sample_id: int = 0
    episode_id: str = ""
    stop_reason: StopReason = "terminated"


def trajectories_from_calls(
    calls: Sequence[LlmCall | Mapping[str, Any]], reward: float, tags: SampleTags = SampleTags()
) -> list[Trajectory]:
    """The episode's samples under the context-edit rule (module docstring). A call the
    model server refused (`error`: no ids) is skipped: nothing was sampled."""
    samples: list[Trajectory] = []
    current: Trajectory | None = None
    last: LlmCall | None = None
    for raw in calls:
        call = raw if isinstance(raw, LlmCall) else _call(raw)
        if call.error is not None:
            continue
        if len(call.completion_token_ids) != len(call.logprobs):
            raise TraceError(
                f"call {call.index}: {len(call.completion_token_ids)} completion ids but "
                f"{len(call.logprobs)} logprobs (ask the server for logprobs)"
            )
        prompt = list(call.prompt_token_ids)
        seen = [] if current is None else current.prompt_ids + current.completion_ids
        if current is not None and last is not None and prompt[: len(seen)] == seen:
            current.append_environment(prompt[len(seen) :])
            current.environment_s += max(0.0, call.started_at - last.started_at - last.proxy_s)
        else:
            if not prompt:
                raise TraceError(f"call {call.index}: no prompt token ids")
            current = Trajectory(
                prompt_ids=prompt,
                reward=reward,
                task=tags.task,
                seed=tags.seed,
                group_id=tags.group_id,
                sample_id=tags.sample_id,
                episode_id=tags.episode_id,
                stop_reason=tags.stop_reason,
            )
            samples.append(current)
        current.append_sampled(list(call.completion_token_ids), list(call.logprobs))
        current.turns += 1
        current.generation_s += call.upstream_s
        last = call
    for sample in samples:
        sample.check()
    return samples


def _call(raw: Mapping[str, Any]) -> LlmCall:
    try:
        return LlmCall.model_validate(raw)
    except ValidationError as exc:
        raise TraceError(f"not an LlmCall: {exc}") from None


def harness_reset_options(
    harness: HarnessOptions | Mapping[str, Any], extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Reset `options` that start `harness` (validated here, so a typo fails before any
    episode starts), over `extra` options."""
    options = HarnessOptions.model_validate(harness)
    body = options.model_dump(mode="json", exclude_none=True)
    return {**(extra or {}), HARNESS_OPTION: body}


class HarnessCollector(GroupCollector):
    """Groups of harness episodes: for each task × G, a reset with `options["harness"]`
    pointing at the trainer's model server, the verdict (`verify` waits for the harness to
    end), the trajectory (GET state), the samples (`trajectories_from_calls`).

    An episode is not trained on (counted as `broken:<reason>`, refilled like any) when it
    is void, lost, over `episode_timeout_s`, made no model call (`no_model_calls`: there
    are no tokens to train, and the agent cannot make a harness fail before its first
    call), or its trace does not convert (`bad_trace`). `max_turns`, `sampling` and the
    context budget of `CollectorConfig` do not apply: the harness and its options rule."""

    def __init__(
        self,
        client: AsyncClient,
        harness: HarnessOptions | Mapping[str, Any],
        tasks: Sequence[str],
        config: CollectorConfig | None = None,
        *,
        seed: int = 0,
    ) -> None:
        super().__init__(client, tasks, config, seed=seed)
        self.harness = HarnessOptions.model_validate(harness)
        self._options = harness_reset_options(self.harness, self.config.reset_options)

    @classmethod
    def over_http(
        cls,
        url: str,
        harness: HarnessOptions | Mapping[str, Any],
        tasks: Sequence[str],
        config: CollectorConfig | None = None,
        *,
        token: str | None = None,
        seed: int = 0,
    ) -> HarnessCollector:
        """A collector with its own HTTP client, whose timeout outlasts an episode (the
        verify call waits for the harness)."""
        config = config or CollectorConfig()
        timeout_s = config.episode_timeout_s + 30.0
        return cls(cls.http_client(url, config, token=token, timeout_s=timeout_s), harness,
                   tasks, config, seed=seed)  # fmt: skip

    def reset_options(self) -> dict[str, Any]:
        return self._options

    async def _play(self, task: str, seed: int, gid: int, sid: int) -> list[Trajectory]:
        reset = await self._reset(task, seed)
        eid = reset.episode_id
        try:
            verdict = await self._retrying(lambda: self.client.verify(eid))
            kind = None if verdict.failure_kind is None else verdict.failure_kind.value
            if verdict.status == "void":
                raise EpisodeBroken("void", verdict.feedback, kind)
            state = await self._retrying(lambda: self.client.state(eid))
            if state.status == EpisodeStatus.VOID:
                failure = None if state.failure is None else state.failure.kind.value
                raise EpisodeBroken("void", state.void_reason or "", failure)
            self.failures.agent(kind)
            samples = episode_samples(state, verdict.reward, SampleTags(task, seed, gid, sid))
            actions = [r.action for r in state.trajectory if r.action.tool != LLM_CALL_TOOL]
            flags = self.monitor(state.domain, actions)
            for sample in samples:
                sample.domain, sample.hack_flags = state.domain, flags
            self.stats["episodes_ok"] += 1
            self.stats["samples"] += len(samples)
            self.stats["context_edits"] += len(samples) - 1
            return samples
        except (NotFoundError, ConflictError) as exc:
            raise EpisodeBroken("lost", exc.message) from None
        except PalaestraError as exc:
            raise EpisodeBroken(f"server_{exc.code}", exc.message) from None
        finally:
            # A harness episode holds a sandbox and a running harness: free them now,
            # whether it ended or this task was cancelled (a straggler).
            self._close_later(eid)


def episode_samples(
    state: Episode, reward: float | None = None, tags: SampleTags = SampleTags()
) -> list[Trajectory]:
    """The samples of one ended harness episode, from what `GET /v1/episodes/{id}`
    returned (the client's `EpisodeState` or the JSON); `reward` defaults to its
    verdict's. EpisodeBroken (`bad_trace`, `no_model_calls`) when there is none to train."""
    try:
        episode = episode_state(state)
        calls = [c for c in llm_calls(episode) if c.error is None]
    except TraceError as exc:
        raise EpisodeBroken("bad_trace", str(exc)) from None
    if not calls:
        raise EpisodeBroken("no_model_calls", f"episode {episode.episode_id}")
    if reward is None:
        if episode.verdict is None:
            raise EpisodeBroken("bad_trace", f"episode {episode.episode_id} has no verdict yet")
        reward = episode.verdict.reward
    tags = SampleTags(tags.task or episode.task, tags.seed, tags.group_id, tags.sample_id,
                      episode.episode_id, stop_reason(episode))  # fmt: skip
    try:
        return trajectories_from_calls(calls, reward, tags)
    except (TraceError, ValueError) as exc:
        raise EpisodeBroken("bad_trace", str(exc)) from None


__all__ = [
    "Episode",
    "HarnessCollector",
    "SampleTags",
    "TraceError",
    "episode_samples",
    "harness_reset_options",
    "llm_calls",
    "step_records",
    "stop_reason",
    "trajectories_from_calls",
]
