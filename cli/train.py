"""`palaestra train`: the CPU demo — a tiny random transformer learns `palaestra/letters`.

It runs the real trainer adapter (collector with batch routes, GRPO, HF backend) against
a server: `--url` for a running one, else an embedded one on a temporary data dir. It
shows live progress (cli/progress.py), stops cleanly on Ctrl-C / SIGTERM, and writes
the reward curve as a PNG (and the figures as JSON).
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path
from typing import Annotated

import typer

from palaestra.cli.console import err, styled
from palaestra.cli.options import Token, Url
from palaestra.cli.progress import LiveProgress
from palaestra.cli.stopping import Stop


def plot_rewards(curves: dict[str, list[float]], out: Path, title: str) -> None:
    """Reward per step (dots) and its 5-step moving mean (line), one colour per curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    for name, rewards in curves.items():
        steps = list(range(1, len(rewards) + 1))
        smooth = [
            sum(rewards[max(0, i - 4) : i + 1]) / len(rewards[max(0, i - 4) : i + 1])
            for i in range(len(rewards))
        ]
        (line,) = ax.plot(steps, smooth, label=f"{name} (5-step mean)")
        ax.scatter(steps, rewards, s=6, alpha=0.4, color=line.get_color())
    ax.set_xlabel("training step")
    ax.set_ylabel("mean episode reward")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)


def train(
    steps: Annotated[int, typer.Option(help="training steps (at most)")] = 150,
    seed: Annotated[int, typer.Option(help="seed of the model, sampling and task draw")] = 0,
    lr: Annotated[float, typer.Option(help="Adam learning rate")] = 3e-3,
    groups: Annotated[int, typer.Option(help="groups (tasks) per step")] = 16,
    group_size: Annotated[int, typer.Option(help="samples per group (G)")] = 8,
    control: Annotated[
        bool, typer.Option(help="also run the shuffled-reward control and plot it")
    ] = False,
    stop_at: Annotated[
        float | None, typer.Option(help="stop once the last 5 steps average this reward")
    ] = None,
    out: Annotated[Path, typer.Option(help="the reward curve (PNG)")] = Path("train-reward.png"),
    threads: Annotated[int, typer.Option(help="torch CPU threads")] = 1,
    url: Url = None,
    token: Token = None,
    data_dir: Annotated[
        Path | None, typer.Option(help="embedded server's data dir (default: a temp dir)")
    ] = None,
) -> None:
    """Train a tiny random transformer on palaestra/letters with GRPO; plot the reward."""
    try:
        import torch

        from palaestra.sdk.train.letters_demo import DemoConfig
    except ImportError as exc:
        err.print(styled("palaestra train needs the `train` extra", "red", f" (torch): {exc}"))
        raise typer.Exit(2) from None
    torch.set_num_threads(threads)
    runs = [("GRPO", False)] + ([("shuffled-reward control", True)] if control else [])
    curves: dict[str, list[float]] = {}
    with Stop("train") as stopper:
        for name, shuffle in runs:
            config = DemoConfig(
                steps=steps,
                seed=seed,
                lr=lr,
                groups_per_step=groups,
                group_size=group_size,
                shuffle_rewards=shuffle,
            )
            curves[name] = stopper.run(_run(config, name, stop_at, url, token, data_dir))
    plot_rewards(curves, out, f"palaestra/letters, tiny GPT-2 from scratch (seed {seed})")
    summary = {
        name: {
            "steps": len(r),
            "first5": round(sum(r[:5]) / max(1, len(r[:5])), 4),
            "last5": round(sum(r[-5:]) / max(1, len(r[-5:])), 4),
            "rewards": [round(x, 4) for x in r],
        }
        for name, r in curves.items()
    }
    out.with_suffix(".json").write_text(json.dumps(summary, indent=1))
    for name, s in summary.items():
        err.print(f"{name}: first-5 mean reward {s['first5']:.3f} → last-5 {s['last5']:.3f}")
    err.print(f"reward curve written to {out} (figures: {out.with_suffix('.json')})")


async def _run(
    config: object,
    name: str,
    stop_at: float | None,
    url: str | None,
    token: str | None,
    data_dir: Path | None,
) -> list[float]:
    from palaestra.cli.clients import resolve_token
    from palaestra.sdk.http import AsyncHTTPClient, RetryPolicy
    from palaestra.sdk.train.letters_demo import DemoConfig, run_demo
    from palaestra.sdk.train.trainer import StepReport
    from palaestra.server.config import load_settings
    from palaestra.server.inprocess import AsyncInProcessClient
    from palaestra.server.runtime import build_manager

    assert isinstance(config, DemoConfig)
    rewards: list[float] = []
    with LiveProgress(name, config.steps, unit="steps") as progress:

        def on_step(report: StepReport) -> None:
            rewards.append(report.mean_reward)
            last = rewards[-5:]
            hacks = report.hacks.get("hack_flagged_share", 0.0)
            progress.advance(
                note=f"reward {report.mean_reward:.3f} (last 5: {sum(last) / len(last):.3f}) "
                f"· hack-flagged {hacks:.0%}"
            )

        def stop(history: list[StepReport]) -> bool:
            if stop_at is None or len(history) < 10:
                return False
            return sum(r.mean_reward for r in history[-5:]) / 5 >= stop_at

        if url:
            http = AsyncHTTPClient(
                url,
                token=resolve_token(token, data_dir),
                retry=RetryPolicy(attempts=1),
                max_connections=config.concurrency,
            )
            async with http:
                await run_demo(http, config, on_step, stop)
            return rewards
        with tempfile.TemporaryDirectory(prefix="palaestra-train-") as tmp:
            settings = load_settings({"data_dir": data_dir or Path(tmp)})
            manager = await asyncio.to_thread(build_manager, settings)  # a stop cuts it
            await manager.start()
            try:
                await run_demo(AsyncInProcessClient(manager), config, on_step, stop)
            finally:
                await manager.shutdown()
    return rewards


def register(app: typer.Typer) -> None:
    app.command("train")(train)
