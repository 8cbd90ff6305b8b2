"""Tinker-style trainers: tinker-cookbook's RL interface (`Env`, `EnvGroupBuilder`,
`RLDataset`) over palaestra episodes, spoken to over HTTP.

`PalaestraEnvGroupBuilder` is an `EnvGroupBuilder` for one task: its `make_envs` starts
`group_size` episodes of the task and makes each a cookbook `Env` with the cookbook's own
tool-use env (`tool_use.build_agent_tool_env`: its renderer renders the conversation to
tokens, parses the model's tokens back into tool calls, and keeps the turn and parse
limits). Each of the episode's tools is a cookbook `Tool` whose call is one step; the
episode's end (`submit`, its step or time limit) stops the env, and the env's grade is the
verifier's verdict. `PalaestraRLDataset` is an `RLDataset` of such builders, one per task.
The server does every check (ownership, sealed splits, quotas); this only translates.

The builder holds only its configuration, so it pickles (the cookbook sends builders to
rollout workers); the episodes live from `make_envs` to `cleanup`, which closes any still
open. A `void` verdict (the infrastructure failed, not the policy) raises `VoidEpisode`:
an error-tolerant rollout strategy drops the trajectory rather than score it 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import chz
from tinker_cookbook.renderers import Renderer, get_renderer
from tinker_cookbook.rl.types import Env, EnvGroupBuilder, RLDataset, RLDatasetBuilder
from tinker_cookbook.tokenizer_utils import get_tokenizer
from tinker_cookbook.tool_use import build_agent_tool_env
from tinker_cookbook.tool_use.types import ToolInput, ToolResult

from palaestra.sdk.errors import InvalidActionError, PalaestraError
from palaestra.sdk.http import AsyncHTTPClient, HTTPClient
from palaestra.sdk.models import Action, ResetResponse, ToolSpec

__all__ = [
    "PalaestraDatasetBuilder",
    "PalaestraEnvGroupBuilder",
    "PalaestraRLDataset",
    "PalaestraServer",
    "VoidEpisode",
]


class VoidEpisode(RuntimeError):
    """The episode's verdict is `void`: an infrastructure fault, not the policy's doing."""


@dataclass(frozen=True)
class PalaestraServer:
    """Where the episodes run: the server's URL and a `train` (or `eval`) token."""

    base_url: str
    token: str | None = None
    timeout_s: float = 120.0

    def client(self) -> AsyncHTTPClient:
        return AsyncHTTPClient(self.base_url, token=self.token, timeout=self.timeout_s)


class Episode:
    """One palaestra episode behind one cookbook `Env`: its tools step it, and the env's
    grade (the cookbook's `reward_fn`) is its verdict."""

    def __init__(self, client: AsyncHTTPClient, reset: ResetResponse) -> None:
        self.client, self.reset = client, reset
        self.id = reset.episode_id
        self.ended = False
        self.steps = 0

    def tools(self) -> list[EpisodeTool]:
        return [EpisodeTool(self, spec) for spec in self.reset.tools]

    async def act(self, spec: ToolSpec, arguments: dict[str, Any], call_id: str) -> ToolResult:
        """One step; a call the server refuses (unknown arguments, a bad value) takes none
        and answers the model with the server's reason, so the episode goes on."""
        if self.ended:
            return ToolResult(messages=[reply(spec.name, call_id, f"error: {OVER}")])
        try:
            step = await self.client.step(self.id, Action(tool=spec.name, arguments=arguments))
        except InvalidActionError as exc:
            message = reply(spec.name, call_id, f"error: {exc.message}")
            return ToolResult(messages=[message], metrics={"palaestra/refused_calls": 1.0})
        self.steps += 1
        self.ended = step.terminated or step.truncated
        return ToolResult(
            messages=[reply(spec.name, call_id, step.observation.text)],
            should_stop=self.ended,
            metadata={"episode_id": self.id, "info": step.info},
        )

    async def grade(self, messages: list[Any]) -> tuple[float, dict[str, float]]:
        """The verdict's reward (an episode the model left open is verified as it is)."""
        verdict = await self.client.verify(self.id)
        self.ended = True
        if verdict.status == "void":
            raise VoidEpisode(f"episode {self.id} is void: {verdict.failure_kind}")
        metrics = {f"palaestra/{k}": v for k, v in verdict.components.items()}
        metrics.update({"palaestra/passed": float(verdict.passed), "palaestra/steps": self.steps})
        return verdict.reward, metrics

    async def close(self) -> None:
        """Close the episode if it is still open (an ended one stays stored, verified)."""
        if not self.ended:
            with contextlib.suppress(PalaestraError):
                await self.client.close(self.id)


OVER = "the episode is over: no more tool calls"


def reply(name: str, call_id: str, text: str) -> dict[str, Any]:
    """A tool result as the cookbook's renderers take it (a `tool` message)."""
    return {"role": "tool", "content": text, "tool_call_id": call_id, "name": name}


class EpisodeTool:
    """One of the episode's tools, as tinker-cookbook's `Tool` protocol has it."""

    def __init__(self, episode: Episode, spec: ToolSpec) -> None:
        self.episode, self.spec = episode, spec

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def description(self) -> str:
        return self.spec.description

    @property
    def parameters_schema(self) -> dict[str, Any]:
        return self.spec.parameters

    async def run(self, input: ToolInput) -> ToolResult:
        return await self.episode.act(self.spec, dict(input.arguments), input.call_id or "")

    def to_spec(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "parameters": self.parameters_schema,
        }


@dataclass
class PalaestraEnvGroupBuilder(EnvGroupBuilder):  # type: ignore[misc]  # cookbook: untyped here
    """`group_size` episodes of `task` ("org/name[@ver]:task_id"), each a cookbook `Env`
    rendered with `renderer_name` over `model_name`'s tokenizer."""

    server: PalaestraServer
    task: str
    model_name: str
    renderer_name: str
    group_size: int = 4
    seed: int | None = None
    max_turns: int = 8
    system_prompt: str = ""
    failed_parse_reward: float = 0.0
    _live: list[Episode] = field(default_factory=list, init=False, repr=False, compare=False)
    _client: AsyncHTTPClient | None = field(default=None, init=False, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        """Only the configuration travels (to a rollout worker): no connection, no episode."""
        return {**self.__dict__, "_live": [], "_client": None}

    def renderer(self) -> Renderer:
        tokenizer = get_tokenizer(self.model_name)
        return get_renderer(self.renderer_name, tokenizer, model_name=self.model_name)

    async def make_envs(self) -> Sequence[Env]:
        if self.group_size < 1:
            raise ValueError(f"group_size must be at least 1, not {self.group_size}")
        self._client = self.server.client()
        resets = [self._client.reset(self.task, seed=self.seed) for _ in range(self.group_size)]
        started = await asyncio.gather(*resets, return_exceptions=True)
        self._live = [Episode(self._client, r) for r in started if isinstance(r, ResetResponse)]
        failed = [r for r in started if isinstance(r, BaseException)]
        if failed:  # cleanup() (which the rollout loop always calls) closes the others
            raise failed[0]
        renderer = await asyncio.to_thread(self.renderer)
        return [self.env(renderer, episode) for episode in self._live]

    def env(self, renderer: Renderer, episode: Episode) -> Env:
        """The cookbook's tool-use env over the episode: the tools and first observation."""
        tools = episode.tools()
        specs = [t.to_spec() for t in tools]
        prefix = renderer.create_conversation_prefix_with_tools(specs, self.system_prompt)
        first = {"role": "user", "content": episode.reset.observation.text}
        return build_agent_tool_env(
            renderer,
            tools,
            [*prefix, first],
            episode.grade,
            max_turns=self.max_turns,
            failed_parse_reward=self.failed_parse_reward,
        )

    async def cleanup(self) -> None:
        """Close the episodes still open, then the connection (never raises)."""
        live, client, self._live, self._client = self._live, self._client, [], None
        await asyncio.gather(*(episode.close() for episode in live))
        if client is not None:
            with contextlib.suppress(Exception):
                await client.aclose()

    def logging_tags(self) -> list[str]:
        return ["palaestra", self.task.split(":", 1)[0].split("@", 1)[0]]


@dataclass
class PalaestraRLDataset(RLDataset):  # type: ignore[misc]  # cookbook: untyped here
    """Batches of `batch_size` task groups: the tasks in order, each made from `builder`
    (its `task` replaced); the last batch may be shorter."""

    tasks: Sequence[str]
    builder: PalaestraEnvGroupBuilder
    batch_size: int = 8

    def __post_init__(self) -> None:
        if self.batch_size < 1 or not self.tasks:
            raise ValueError("PalaestraRLDataset needs tasks and a batch_size of at least 1")

    @classmethod
    def from_split(
        cls, builder: PalaestraEnvGroupBuilder, pack: str, split: str, batch_size: int = 8
    ) -> PalaestraRLDataset:
        """Every task of `pack`'s `split`, as the server lists them (GET /v1/tasks)."""
        server = builder.server
        with HTTPClient(server.base_url, token=server.token, timeout=server.timeout_s) as client:
            listed = client.tasks(pack=pack, split=split, limit=10_000)
        return cls([t.id for t in listed.tasks], builder, batch_size)

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        if not 0 <= index < len(self):
            raise IndexError(f"batch {index} of {len(self)}")
        start = index * self.batch_size
        chosen = self.tasks[start : start + self.batch_size]
        return [replace(self.builder, task=task) for task in chosen]

    def __len__(self) -> int:
        return math.ceil(len(self.tasks) / self.batch_size)


@chz.chz
class PalaestraDatasetBuilder(RLDatasetBuilder):  # type: ignore[misc]  # cookbook: untyped here
    """The cookbook's `RLDatasetBuilder` (what `rl.train.Config.dataset_builder` takes, set
    from its `chz` command line): a pack's `split` to train on, and `test_split` (if any;
    a sealed one needs an `eval` token to run)."""

    base_url: str
    pack: str
    model_name: str
    renderer_name: str
    token: str | None = None
    split: str = "train"
    test_split: str | None = None
    batch_size: int = 8
    group_size: int = 4
    max_turns: int = 8
    system_prompt: str = ""

    async def __call__(self) -> tuple[PalaestraRLDataset, PalaestraRLDataset | None]:
        template = PalaestraEnvGroupBuilder(
            PalaestraServer(self.base_url, self.token),
            task="",
            model_name=self.model_name,
            renderer_name=self.renderer_name,
            group_size=self.group_size,
            max_turns=self.max_turns,
            system_prompt=self.system_prompt,
        )
        splits = [self.split] if self.test_split is None else [self.split, self.test_split]
        made = [
            await asyncio.to_thread(
                PalaestraRLDataset.from_split, template, self.pack, s, self.batch_size
            )
            for s in splits
        ]
        return made[0], made[1] if len(made) > 1 else None
