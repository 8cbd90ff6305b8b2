"""Training from harness episodes end to end: a real `palaestra serve` on loopback runs the
built-in bash agent in bwrap sandboxes against the real model server (HFBackend over the
random tiny Qwen2, recording the ids it generated); HarnessCollector turns the proxy's
records into samples whose ids are exactly the server's, and one GRPO step runs on them.
The in-process client drives the same collector with FakeModel (a scripted upstream, a
fake) so that one episode solves its task and one does not. `palaestra run --harness`
prints the verdict and the call table."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

torch = pytest.importorskip("torch", reason="needs the `train` extra (torch)")

from palaestra.sdk.http import HTTPClient  # noqa: E402
from palaestra.sdk.train.collector import (  # noqa: E402
    CollectorConfig,
    EpisodeBroken,
)
from palaestra.sdk.train.grpo import (  # noqa: E402
    GRPOConfig,
    group_advantages,
    grpo_loss,
    make_batch,
    token_logprobs,
)
from palaestra.sdk.train.harness import (  # noqa: E402
    HarnessCollector,
    TraceError,
    episode_samples,
    llm_calls,
    stop_reason,
)
from palaestra.sdk.train.types import Group, Trajectory  # noqa: E402
from palaestra.server.harness.toolchain import mini_swe_agent  # noqa: E402
from palaestra.server.inprocess import AsyncInProcessClient  # noqa: E402
from palaestra.server.runtime import build_manager  # noqa: E402
from tests.conftest import BIN, ServerProcess, cli_env, make_settings  # noqa: E402
from tests.harness_peers import (  # noqa: E402
    SOLVE_2,
    TRAIN_TASK,
    RecordingModel,
    finished,
    harness,
    recording_model,
    started,
)
from tests.peers.fake_model import CONTEXT_TOO_LONG, FakeModel, bash_call, submit_call  # noqa: E402
from tests.peers.tiny_models import make_models  # noqa: E402
from tests.sdk.train.test_openai_server import CACHE  # noqa: E402
from tests.server.test_sealed import make_token  # noqa: E402

SAMPLING = {"temperature": 1.0, "max_tokens": 12}
SOLVE = (
    "cat > solution.py <<'PY'\ndef truncate_number(number):\n    return number - int(number)\nPY"
)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RecordingModel]:
    with recording_model(tmp_path_factory.mktemp("model"), "random") as served:
        yield served


@pytest.fixture(scope="module")
def token(door_server: ServerProcess) -> str:
    return make_token(door_server, "train", "harness")


def sampled_runs(t: Trajectory) -> list[list[int]]:
    """The runs of sampled (mask 1) tokens of a sample, in order."""
    runs: list[list[int]] = []
    for k, (token, mask) in enumerate(zip(t.completion_ids, t.loss_mask, strict=True)):
        if mask and (k == 0 or not t.loss_mask[k - 1]):
            runs.append([])
        if mask:
            runs[-1].append(token)
    return runs


def collect(collector: HarnessCollector, groups: int = 1) -> list[Group]:
    async def go() -> list[Group]:
        try:
            return await collector.collect(groups)
        finally:
            await collector.aclose()

    return asyncio.run(go())


def test_http_collector_samples_are_the_servers_ids_and_train(
    door_server: ServerProcess, token: str, model: RecordingModel
) -> None:
    option = harness(model.endpoint, sampling=SAMPLING, config={"max_turns": 3})
    config = CollectorConfig(group_size=2, concurrency=2, episode_timeout_s=240)
    collector = HarnessCollector.over_http(door_server.url, option, [TRAIN_TASK], config,
                                           token=token, seed=1)  # fmt: skip
    [group] = collect(collector)
    assert collector.stats["episodes_ok"] == 2 and collector.stats["broken:void"] == 0
    # Garbage from the random model: no tool call, one nudge, a second call, the agent
    # stops; no solution file, so 0 (the agent's failure), never void.
    assert group.rewards == [0.0, 0.0]
    episodes = {t.episode_id for t in group.trajectories}
    assert len(episodes) == 2 and all(t.stop_reason == "terminated" for t in group.trajectories)

    generated = model.generated()
    assert len(generated) == 4  # 2 episodes × 2 calls
    runs = [run for t in group.trajectories for run in sampled_runs(t)]
    # Each call's completion is one run of sampled tokens, exactly as the server made it.
    assert sorted(runs) == sorted(g["token_ids"] for g in generated)
    prompts = [g["prompt_token_ids"] for g in generated]
    for t in group.trajectories:
        assert t.prompt_ids in prompts  # a sample starts on a prompt the server saw
        assert t.turns >= 1 and len(t.logprobs) == len(t.completion_ids)
        assert all(lp <= 0.0 for lp, m in zip(t.logprobs, t.loss_mask, strict=True) if m)

    # One GRPO step on them: the trainer's logprobs of the sampled tokens match the
    # server's (same weights), and the gradient flows. The tiny model cannot solve the
    # task (all rewards 0, a zero-variance group), so the step takes ±1 advantages.
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    policy = AutoModelForCausalLM.from_pretrained(make_models(CACHE / "tiny-models")["random"])
    kept, zero = group_advantages([group], GRPOConfig())
    assert (kept, zero) == ([], 1)
    for k, t in enumerate(group.trajectories):
        t.advantage = 1.0 if k % 2 == 0 else -1.0
    batch = make_batch(group.trajectories)
    logprobs = token_logprobs(policy, batch)
    loss, stats = grpo_loss(logprobs, batch)
    assert stats["tokens"] == sum(len(r) for r in runs)
    assert stats["max_abs_logprob_diff"] < 0.02, stats  # bf16: cached vs full pass (0.004)
    loss.backward()
    grads = [p.grad for p in policy.parameters() if p.grad is not None]
    assert torch.isfinite(loss) and sum(float(g.abs().sum()) for g in grads) > 0


def test_in_process_collector_with_a_scripted_agent(tmp_path: Path) -> None:
    fake = FakeModel([bash_call(SOLVE), submit_call(), bash_call("true"), submit_call()])
    manager = build_manager(make_settings(data_dir=tmp_path / "data"))

    async def go(url: str) -> tuple[list[Group], Any]:
        await manager.start()
        try:
            config = CollectorConfig(group_size=2, concurrency=1, batch_routes=False)
            collector = HarnessCollector(AsyncInProcessClient(manager),
                                         harness(url, sampling={"temperature": 0.5}),
                                         [TRAIN_TASK], config)  # fmt: skip
            groups = await collector.collect(1)
            await collector.drain()
            return groups, collector.stats
        finally:
            await manager.shutdown()

    with fake.serve() as url:
        [group], stats = asyncio.run(go(url))
    assert sorted(group.rewards) == [0.0, 1.0], group.rewards  # one solved, one did not
    assert stats["episodes_ok"] == 2 and len(fake.requests) == 4
    assert all(r["temperature"] == 0.5 for r in fake.requests)  # the proxy's sampling
    # FakeModel's made-up ids never extend (one id a message): each call its own sample.
    assert len(group.trajectories) == 4 and stats["context_edits"] == 2
    kept, zero = group_advantages([group])
    assert zero == 0 and sorted({t.advantage for t in kept}) == [-0.5, 0.5]


def test_cli_run_harness_prints_the_verdict_and_the_calls(
    door_server: ServerProcess, token: str, model: RecordingModel, tmp_path: Path
) -> None:
    argv = [str(BIN / "palaestra"), "run", TRAIN_TASK, "--harness", "bash-agent",
            "--model-endpoint", model.endpoint, "--sampling", '{"max_tokens": 8}',
            "--config", '{"max_turns": 1}', "--url", door_server.url, "--token", token]  # fmt: skip
    done = subprocess.run(argv, env=cli_env(), capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert '"reward": 0.0' in out and '"status": "ok"' in out
    assert "1 model calls" in out  # --model: the endpoint's GET /models named "tiny"
    [row] = [line for line in out.splitlines() if "openai-chat" in line]
    cells = [c.strip() for c in row.strip(" │|").split("│")]
    completion = int(cells[3])
    assert 1 <= completion <= 8  # --sampling's max_tokens reached the model
    assert "harness_end: the harness exited with code 1" in out  # out of turns
    assert f"1 training sample(s), {completion} sampled tokens" in out


def test_the_helpers_take_what_get_episode_returns(door_server: ServerProcess, token: str) -> None:
    """`GET /v1/episodes/{id}` as its JSON (httpx), as the HTTP client's `EpisodeState`, or
    its trajectory: the training helpers take each and agree."""
    fake = FakeModel([bash_call(SOLVE_2), submit_call()])
    with fake.serve() as url:
        episode = started(door_server, token, TRAIN_TASK, harness(url))
        doc = finished(door_server, token, episode)  # the route's JSON, as httpx gives it
    with HTTPClient(door_server.url, token=token) as client:
        state = client.state(episode)
    assert doc["verdict"]["reward"] == 1.0
    calls = llm_calls(doc)
    assert [c.index for c in calls] == [0, 1]
    assert llm_calls(state) == llm_calls(doc["trajectory"]) == llm_calls(state.trajectory) == calls
    assert stop_reason(doc) == stop_reason(state) == "terminated"
    samples = episode_samples(doc)  # the reward: the verdict's
    assert samples == episode_samples(state) == episode_samples(state, 1.0)
    assert all(s.reward == 1.0 and s.episode_id == episode for s in samples)
    assert all(s.task == doc["task"] for s in samples)
    with pytest.raises(EpisodeBroken, match="GET /v1/episodes"):
        episode_samples({"episode_id": episode})
    with pytest.raises(TraceError, match=r"trajectory\[0\]: not a step record"):
        llm_calls([{"index": 0}])


@pytest.mark.parametrize("name", ["bash-agent", "mini-swe-agent"])
def test_cli_run_harness_prints_the_model_servers_refusal(
    door_server: ServerProcess, token: str, name: str
) -> None:
    """The model server refuses the second call (vLLM's context-length 400): the report
    says so, with the agent's own last words, instead of a row of zeros."""
    if name == "mini-swe-agent" and not mini_swe_agent().available:
        pytest.skip(f"mini-swe-agent toolchain: {mini_swe_agent().reason}")
    fake = FakeModel([bash_call("ls"), CONTEXT_TOO_LONG])
    with fake.serve() as url:
        argv = [str(BIN / "palaestra"), "run", TRAIN_TASK, "--harness", name,
                "--model-endpoint", url, "--url", door_server.url, "--token", token]  # fmt: skip
        done = subprocess.run(argv, env=cli_env(), capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    [row] = [line for line in out.splitlines() if "openai-chat" in line and "refused" in line]
    cells = [c.strip() for c in row.strip(" │|").split("│")]
    assert cells[0] == "1" and cells[2:5] == ["0", "0", "refused"]
    status, message = CONTEXT_TOO_LONG
    assert f"call 1: the model server refused it: HTTP {status}: {message}" in out
    assert "the harness's last output:" in out  # the agent's account of it
    assert "ContextWindowExceeded" in out if name == "mini-swe-agent" else "HTTP 400" in out
    assert "1 training sample(s)" in out  # the refused call has nothing to train
