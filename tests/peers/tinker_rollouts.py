"""tinker-cookbook 0.6.1's own rollout loop (`rl.rollouts.do_group_rollout`) and its
training-data path (`rl.data_processing`) over palaestra episodes through
sdk/integrations/tinker.py. Run by tests/sdk/integrations/test_integration_tinker.py with
the peer's python:

    tinker_rollouts.py URL TRAIN_TOKEN TOKENIZER_DIR

No Tinker service is reachable here, so the policy is `ScriptedPolicy`, a local stand-in
for the cookbook's `TinkerTokenCompleter`: a `TokenCompleter` that answers each turn with
scripted text, encoded by the tokenizer, and records the prompts (token ids, decoded) it
was given. Everything else is the cookbook's: the renderer (`qwen3_instruct`, over the tiny
ChatML tokenizer of tests/peers/tiny_models.py), its tool-call parser, the tool-use env, the
rollout loop, advantages and datums. The last stdout line is JSON with what came back.
"""

from __future__ import annotations

import asyncio
import json
import pickle
import sys
from typing import Any

import tinker
from tinker_cookbook.completers import TokenCompleter, TokensWithLogprobs
from tinker_cookbook.rl.data_processing import assemble_training_data, compute_advantages
from tinker_cookbook.rl.rollouts import do_group_rollout
from tinker_cookbook.rl.types import TrajectoryGroup
from tinker_cookbook.tokenizer_utils import get_tokenizer

from palaestra.sdk.integrations.tinker import (
    PalaestraDatasetBuilder,
    PalaestraEnvGroupBuilder,
    PalaestraRLDataset,
    PalaestraServer,
)

LOGPROB = -0.25  # what the stand-in policy says each of its tokens had


def call(name: str, **arguments: Any) -> str:
    """A Hermes tool call, as Qwen models (and the qwen3 renderers) write one."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


class ScriptedPolicy(TokenCompleter):  # type: ignore[misc]
    """A local stand-in for a sampled policy: turn n of a conversation answers script[n]
    (or, with `alternate`, the first turn of the k-th conversation answers alternate[k % 2])."""

    def __init__(self, tokenizer: Any, script: list[str], alternate: list[str] | None = None):
        self.tokenizer, self.script, self.alternate = tokenizer, script, alternate
        self.prompts: list[str] = []
        self.calls = 0

    async def __call__(
        self, model_input: tinker.ModelInput, stop: Any, *, max_tokens: int | None = None
    ) -> TokensWithLogprobs:
        prompt = self.tokenizer.decode(model_input.to_ints())
        self.prompts.append(prompt)
        turn = prompt.count("<|im_start|>assistant") - 1
        if self.alternate is not None:
            text = self.alternate[self.calls % 2]
        else:
            text = self.script[min(turn, len(self.script) - 1)]
        self.calls += 1
        tokens = self.tokenizer.encode(text + "<|im_end|>", add_special_tokens=False)
        return TokensWithLogprobs(tokens=tokens, maybe_logprobs=[LOGPROB] * len(tokens))


def summary(group: TrajectoryGroup) -> dict[str, Any]:
    return {
        "total_rewards": group.get_total_rewards(),
        "trajectories": [
            {
                "rewards": [t.reward for t in traj.transitions],
                "done": [t.episode_done for t in traj.transitions],
                "stop_reason": traj.stop_reason,
                "metrics": traj.transitions[-1].metrics,
                "logs": [t.logs for t in traj.transitions],
            }
            for traj in group.trajectories_G
        ],
    }


async def main() -> None:
    url, token, tokenizer_dir = sys.argv[1:4]
    tokenizer = get_tokenizer(tokenizer_dir)
    server = PalaestraServer(url, token)
    builder = PalaestraEnvGroupBuilder(
        server,
        task="palaestra/echo:say-birch",
        model_name=tokenizer_dir,
        renderer_name="qwen3_instruct",
        group_size=2,
        max_turns=6,
    )
    builder = pickle.loads(pickle.dumps(builder))  # as the cookbook sends it to a worker
    out: dict[str, Any] = {}

    # Tools, a refused call, a tool the env does not have, then the answer.
    tools = ScriptedPolicy(
        tokenizer,
        [
            call("echo", text="hello"),
            call("echo", txt=1),
            call("teleport", to="moon"),
            call("submit", answer="hcrib"),
        ],
    )
    multi = await do_group_rollout(builder, tools)
    out["multi"] = summary(multi)
    out["first_prompt"] = tools.prompts[0]
    out["last_prompt"] = max(tools.prompts, key=len)

    # One right and one wrong answer in a group: GRPO's advantages and the datums.
    mixed = ScriptedPolicy(
        tokenizer, [], [call("submit", answer="hcrib"), call("submit", answer="x")]
    )
    group = await do_group_rollout(builder, mixed)
    advantages = compute_advantages([group])
    data, _ = assemble_training_data([group], advantages)
    out["mixed"] = summary(group)
    out["advantages"] = advantages[0].tolist()
    out["datums"] = [
        {
            "mask": d.loss_fn_inputs["mask"].to_torch().tolist(),
            "logprobs": d.loss_fn_inputs["logprobs"].to_torch().tolist(),
            "advantages": d.loss_fn_inputs["advantages"].to_torch().tolist(),
        }
        for d in data
    ]

    # A model that answers with no tool call: the episode is verified as it is (0).
    silent = ScriptedPolicy(tokenizer, ["I will not call a tool."])
    out["silent"] = summary(await do_group_rollout(replace_size(builder, 1), silent))

    dataset = PalaestraRLDataset.from_split(builder, "palaestra/echo", "train", batch_size=3)
    out["dataset"] = {
        "len": len(dataset),
        "batches": [[b.task for b in dataset.get_batch(i)] for i in range(len(dataset))],
    }
    configured = PalaestraDatasetBuilder(
        base_url=url,
        token=token,
        pack="palaestra/echo",
        model_name=tokenizer_dir,
        renderer_name="qwen3_instruct",
        test_split="heldout",  # a sealed split: its references only reach a train token
        batch_size=4,
    )
    train, test = await configured()
    out["dataset_builder"] = {
        "train": [[b.task for b in train.get_batch(i)] for i in range(len(train))],
        "test": [[b.task for b in test.get_batch(i)] for i in range(len(test))],
        "group_size": train.get_batch(0)[0].group_size,
    }
    try:
        dataset.get_batch(len(dataset))
        out["past_the_end"] = "no error"
    except IndexError as exc:
        out["past_the_end"] = str(exc)

    sealed = replace_size(builder, 2)
    sealed.task = "palaestra/echo:say-apple"  # on echo's sealed heldout split
    try:
        await do_group_rollout(sealed, tools)
        out["sealed"] = "no error"
    except Exception as exc:  # the sdk's own error, whatever its class
        out["sealed"] = f"{type(exc).__name__}: {exc}"
    print(json.dumps(out))


def replace_size(builder: PalaestraEnvGroupBuilder, size: int) -> PalaestraEnvGroupBuilder:
    copy = pickle.loads(pickle.dumps(builder))
    copy.group_size = size
    return copy


if __name__ == "__main__":
    asyncio.run(main())
