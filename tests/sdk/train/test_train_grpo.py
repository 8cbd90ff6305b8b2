"""GRPO pieces: masks, logprob agreement, zero-variance groups, advantages."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="needs the `train` extra (torch)")

from conftest import make_settings  # noqa: E402

from palaestra.sdk.train.backends import HFBackend  # noqa: E402
from palaestra.sdk.train.collector import CollectorConfig, RolloutCollector  # noqa: E402
from palaestra.sdk.train.grpo import (  # noqa: E402
    GRPOConfig,
    group_advantages,
    grpo_loss,
    make_batch,
    token_logprobs,
)
from palaestra.sdk.train.letters_demo import VOCAB, LettersFormat, tiny_model  # noqa: E402
from palaestra.sdk.train.tokenizers import CharTokenizer  # noqa: E402
from palaestra.sdk.train.types import Group, SamplingParams, Trajectory  # noqa: E402
from palaestra.server.inprocess import AsyncInProcessClient  # noqa: E402
from palaestra.server.runtime import build_manager  # noqa: E402

TOK = CharTokenizer(VOCAB)


def _traj(reward: float, sampled: list[str], env: list[str], logprob: float = -1.0) -> Trajectory:
    """prompt `<bos>1a`, then sampled / environment turns alternating."""
    t = Trajectory(prompt_ids=[0, *TOK.encode("1a")], reward=reward)
    for i, turn in enumerate(sampled):
        ids = TOK.encode(turn)
        t.append_sampled(ids, [logprob] * len(ids))
        if i < len(env):
            t.append_environment(TOK.encode(env[i]))
    return t


def test_environment_tokens_get_zero_gradient() -> None:
    torch.manual_seed(0)
    model = tiny_model(TOK.vocab_size)
    trajs = [_traj(1.0, ["c"], []), _traj(0.0, ["d", "c"], ["-"]), _traj(0.25, ["a", "b"], ["+"])]
    groups = [Group(0, "t", 0, trajs)]
    kept, zero = group_advantages(groups)
    assert zero == 0 and len(kept) == 3
    batch = make_batch(kept)
    logits_seen: list[torch.Tensor] = []
    hook = model.lm_head.register_forward_hook(lambda m, i, o: logits_seen.append(o))
    logp = token_logprobs(model, batch)
    hook.remove()
    logits = logits_seen[0]
    logits.retain_grad()
    logp.retain_grad()
    batch.gen_logprobs = logp.detach() * batch.loss_mask  # on-policy: ratio 1, nothing clipped
    loss, _ = grpo_loss(logp, batch, GRPOConfig())
    loss.backward()
    mask = batch.loss_mask.bool()
    assert logp.grad is not None and logits.grad is not None
    # Exactly the sampled tokens carry gradient; env tokens, prompt and padding carry none.
    assert torch.all(logp.grad[~mask] == 0)
    assert torch.all(logp.grad[mask] != 0)
    row_grad = logits.grad[:, :-1, :].abs().sum(-1)
    assert torch.all(row_grad[~mask] == 0) and torch.all(row_grad[mask] > 0)
    # The environment token `-` of the second trajectory sits at a masked position.
    env_pos = len(kept[1].prompt_ids) - 1 + 1
    assert batch.input_ids[1, env_pos + 1] == TOK.encode("-")[0]
    assert not mask[1, env_pos]


def test_zero_variance_group_gives_zero_loss() -> None:
    torch.manual_seed(0)
    model = tiny_model(TOK.vocab_size)
    group = Group(0, "t", 0, [_traj(0.5, ["c"], []), _traj(0.5, ["d", "e"], ["+"])])
    kept, zero = group_advantages([group], GRPOConfig(drop_zero_variance=True))
    assert zero == 1 and kept == []
    kept, zero = group_advantages([group], GRPOConfig(drop_zero_variance=False))
    assert zero == 1 and [t.advantage for t in kept] == [0.0, 0.0]
    batch = make_batch(kept)
    logp = token_logprobs(model, batch)
    loss, _ = grpo_loss(logp, batch, GRPOConfig())
    loss.backward()
    assert float(loss.detach()) == 0.0
    assert all(p.grad is None or torch.all(p.grad == 0) for p in model.parameters())


def test_advantages_and_std_normalisation() -> None:
    group = Group(0, "t", 0, [_traj(r, ["c"], []) for r in (1.0, 0.0, 0.0, 1.0)])
    kept, _ = group_advantages([group])
    assert [t.advantage for t in kept] == [0.5, -0.5, -0.5, 0.5]
    kept, _ = group_advantages([group], GRPOConfig(normalize_std=True))
    assert [round(t.advantage, 4) for t in kept] == [1.0, -1.0, -1.0, 1.0]


def test_clipped_ratio_and_tis() -> None:
    trajs = [_traj(1.0, ["c"], [], logprob=-2.0), _traj(0.0, ["d"], [], logprob=-2.0)]
    kept, _ = group_advantages([Group(0, "t", 0, trajs)])
    batch = make_batch(kept)
    mask = batch.loss_mask
    # Trainer prob far above the generator's: the ratio is clipped at 1 + ε for A > 0.
    logp = torch.where(mask.bool(), torch.full_like(mask, -0.5), torch.zeros_like(mask))
    logp.requires_grad_(True)
    loss, stats = grpo_loss(logp, batch, GRPOConfig(clip_high=0.2))
    assert stats["clip_fraction"] > 0
    # A>0 row: min(e^1.5·0.5, 1.2·0.5) = 0.6; A<0 row: min(e^1.5·-0.5, 1.2·-0.5) = -2.24
    expected = -(0.6 + torch.exp(torch.tensor(1.5)) * -0.5) / 2
    assert torch.isclose(loss, expected, atol=1e-5)
    with pytest.raises(ValueError, match="old_logprobs"):
        grpo_loss(logp, batch, GRPOConfig(tis_cap=2.0))
    old = torch.where(mask.bool(), torch.full_like(mask, -0.5), torch.zeros_like(mask))
    tis, _ = grpo_loss(logp, batch, GRPOConfig(tis_cap=2.0), old_logprobs=old)
    # ρ vs old = 1 → surrogate = A; weight = min(e^{1.5}, 2) = 2 → loss = -(2·0.5 − 2·0.5)/2
    assert abs(float(tis.detach())) < 1e-6


def test_generator_and_trainer_logprobs_agree_at_step_0(tmp_path: Path) -> None:
    """Real episodes (in process, batch routes), multi-turn: the trainer's logprobs of the
    sampled tokens equal the generator's (left-padded, KV-cached, batched) ones."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = tiny_model(TOK.vocab_size)

    async def go() -> list[Group]:
        manager = build_manager(make_settings(data_dir=tmp_path / "data"))
        await manager.start()
        backend = HFBackend(model)
        try:
            collector = RolloutCollector(
                AsyncInProcessClient(manager),
                backend,
                LettersFormat(TOK),
                [f"palaestra/letters:next-{c}" for c in "abcdefgh"],
                CollectorConfig(group_size=4, max_turns=4, sampling=SamplingParams(max_tokens=1)),
            )
            groups = await collector.collect(8)
            assert backend.batches < backend.batched_requests  # requests were batched
            return groups
        finally:
            await backend.aclose()
            await manager.shutdown()

    groups = asyncio.run(go())
    trajs = [t for g in groups for t in g.trajectories]
    assert len(trajs) == 32
    assert any(t.turns > 1 for t in trajs), "no multi-turn episode among 32"
    assert all(t.weight_version == 0 for t in trajs)
    batch = make_batch(trajs)
    with torch.no_grad():
        logp = token_logprobs(model, batch)
    mask = batch.loss_mask.bool()
    diff = (logp - batch.gen_logprobs)[mask].abs().max()
    assert float(diff) < 1e-4, f"generator vs trainer logprobs differ by {float(diff)}"
    _, stats = grpo_loss(logp, batch)
    assert abs(stats["mean_ratio"] - 1.0) < 1e-4
