"""`palaestra run --harness NAME --model-endpoint URL TASK`: one harness episode.

The harness (docs/harness.md) runs in the episode's sandbox and calls the model through
the episode's proxy; this starts it, waits for the verdict (`verify` waits for the harness
to end), and prints the verdict and one row per model call the proxy recorded.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
from rich.table import Table

from palaestra.cli.clients import reset_when_warm
from palaestra.cli.console import console
from palaestra.sdk.client import AsyncClient
from palaestra.sdk.harness import LLM_CALL_TOOL, HarnessOptions, LlmCall
from palaestra.sdk.models import EpisodeState
from palaestra.sdk.train.harness import (
    TraceError,
    harness_reset_options,
    llm_calls,
    trajectories_from_calls,
)


class HarnessArgumentError(ValueError):
    """A command-line value that cannot start a harness; the message says what to fix."""


def parse_json_object(value: str | None, option: str) -> dict[str, Any]:
    """`--sampling` / `--config`: a JSON object, or nothing."""
    if not value:
        return {}
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise HarnessArgumentError(f"{option} is not JSON ({exc}): {value!r}") from None
    if not isinstance(parsed, dict):
        raise HarnessArgumentError(f'{option} must be a JSON object, like {{"temperature": 1.0}}')
    return parsed


async def served_model(endpoint: str) -> str:
    """The first model `GET {endpoint}/models` lists (for a run without `--model`)."""
    url = endpoint.rstrip("/") + "/models"
    try:
        async with httpx.AsyncClient(timeout=10) as http:
            reply = await http.get(url)
            reply.raise_for_status()
            return str(reply.json()["data"][0]["id"])
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise HarnessArgumentError(
            f"no --model given and {url} does not list one ({exc}); pass --model NAME"
        ) from None


def harness_options(
    name: str,
    endpoint: str,
    model: str,
    sampling: str | None,
    config: str | None,
    max_calls: int | None,
    max_tokens: int | None,
) -> HarnessOptions:
    try:
        return HarnessOptions(
            name=name,
            model_endpoint=endpoint,
            model=model,
            sampling=parse_json_object(sampling, "--sampling"),
            config=parse_json_object(config, "--config"),
            max_calls=max_calls,
            max_tokens=max_tokens,
        )
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        raise HarnessArgumentError(str(exc)) from None


def call_table(calls: list[LlmCall]) -> Table:
    """One row per model call: tokens, finish reason, upstream latency, proxy overhead."""
    table = Table("call", "api", "prompt tok", "completion tok", "finish", "upstream s",
                  "proxy +ms", title=f"{len(calls)} model calls")  # fmt: skip
    for c in calls:
        overhead_ms = max(0.0, c.proxy_s - c.upstream_s) * 1000
        table.add_row(
            str(c.index),
            c.api + (" (stream)" if c.stream else ""),
            str(len(c.prompt_token_ids)),
            str(len(c.completion_token_ids)),
            c.finish_reason or ("refused" if c.error else "-"),
            f"{c.upstream_s:.3f}",
            f"{overhead_ms:.1f}",
        )
    return table


OUTPUT_TAIL_LINES = 12  # of a failed harness's own output, printed after the table


def harness_output_tail(info: dict[str, Any]) -> str:
    """The last lines a harness printed, when it exited with an error (its own account of
    what failed: a traceback, the model error it gave up on)."""
    status, output = info.get("harness"), info.get("harness_output")
    if not isinstance(status, dict) or not isinstance(output, str) or not output.strip():
        return ""
    if status.get("exit_code") in (0, None):
        return ""
    return "\n".join(output.rstrip().splitlines()[-OUTPUT_TAIL_LINES:])


def report(state: EpisodeState) -> None:
    """The verdict and the call table of an ended harness episode."""
    if state.verdict is not None:
        console.print_json(state.verdict.model_dump_json())
    if state.void_reason:
        console.print(f"void: {state.void_reason}")
    calls = llm_calls(state)
    console.print(call_table(calls))
    for c in calls:  # what the model server said, not a silent row of zeros
        if c.error:
            console.print(f"call {c.index}: the model server refused it: {c.error}", soft_wrap=True)
    ended = [r for r in state.trajectory if r.action.tool != LLM_CALL_TOOL]
    for r in ended:
        console.print(f"{r.action.tool}: {r.observation.text}".rstrip(), soft_wrap=True)
        tail = harness_output_tail(r.info)
        if tail:
            console.print(f"the harness's last output:\n{tail}", soft_wrap=True, markup=False)
    if not calls:
        return
    try:
        samples = trajectories_from_calls(calls, state.verdict.reward if state.verdict else 0.0)
    except TraceError as exc:
        console.print(f"not trainable: {exc}")
        return
    sampled = sum(sum(s.loss_mask) for s in samples)
    console.print(f"{len(samples)} training sample(s), {sampled} sampled tokens")


async def run_harness(client: AsyncClient, task: str, options: HarnessOptions) -> EpisodeState:
    """Start the harness episode, wait for its verdict, print it; the ended state."""
    reset = await reset_when_warm(client, task, harness_reset_options(options))
    console.rule(f"episode {reset.episode_id} (harness {options.name})")
    try:
        await client.verify(reset.episode_id)  # waits for the harness to end
        state = await client.state(reset.episode_id)
        report(state)
        return state
    finally:
        await client.close(reset.episode_id)
