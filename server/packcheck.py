"""`palaestra pack check`: prove a pack before it is published (DESIGN §6).

The check runs through the real machinery (an embedded episode manager and the in-process
client, with the server's sandboxes): pack.toml against its schema; pack.lock; loading
twice gives the same tasks; for every task, the family's oracle scores at least the task's
expected reward, a rerun of the oracle gives the same verdict, the null agent scores 0, and
each known cheat of the family scores at most `checks.cheat_max_reward`. Every problem is
listed (not just the first) with what to fix; a verifier that crashes (void episode) or
hangs (per-episode timeout) is a failure, never a hang of the check itself.

It lives beside the in-process server it builds (server/runtime.py's `build_manager`,
server/inprocess.py): server/packs, the pack machinery, sits below the manager and the
families (pyproject's import-linter contract "packs").
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import tempfile
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from palaestra.envs import cheatlib
from palaestra.envs.base import Family
from palaestra.envs.cheatlib import GenericCheat, Script
from palaestra.sdk.errors import PalaestraError
from palaestra.sdk.models import Verdict
from palaestra.sdk.task import Task
from palaestra.server.config import Settings
from palaestra.server.families import FamilyRegistry
from palaestra.server.inprocess import AsyncInProcessClient
from palaestra.server.packcheck_report import (
    CheckReport,
    OverLimit,
    Problem,
    TaskResult,
)
from palaestra.server.packs.loader import Pack, inspect_pack
from palaestra.server.packs.lock import LOCK_FILE
from palaestra.server.runtime import build_manager

__all__ = [  # the report's shapes live in packcheck_report.py; importers use them from here
    "CheckReport",
    "OverLimit",
    "Problem",
    "TaskResult",
    "audit_pack",
    "check_pack",
    "choose_tasks",
    "play_episode",
    "play_tasks",
]

GRACE_S = 1.0  # after a timeout, how long a cancelled episode may take to wind down
MAX_BUILT_STEPS = 16  # the step limit of an episode whose actions depend on its observation


def _load_problem(root: Path, message: str) -> Problem:
    text = message.replace(f"{root}/", "")
    check = "lock" if LOCK_FILE in text.split(":", 1)[0] else "load"
    where, _, rest = text.partition(": ")
    return Problem(where=where if rest else str(root), check=check, message=rest or text)


@dataclass
class EpisodeRun:
    """How one played episode ended: its verdict, or why it gave none."""

    verdict: Verdict | None = None
    error: str | None = None
    refused: bool = False  # a tool refused one of its actions as malformed (422)


async def play_episode(
    client: AsyncInProcessClient, task: Task, script: Script, timeout_s: float
) -> EpisodeRun:
    """Play `script` (actions, or a function of the first observation giving them) on `task`
    in a fresh episode and verify; never waits past the timeout."""
    episode_id: list[str] = []

    async def play() -> Verdict:
        fixed = None if callable(script) else list(script)
        steps = len(fixed) + 1 if fixed is not None else MAX_BUILT_STEPS
        reset = await client.reset(task.ref, options={"max_steps": steps})
        episode_id.append(reset.episode_id)
        try:
            actions = fixed if fixed is not None else list(script(reset.observation))  # type: ignore[operator]
            for i, action in enumerate(actions):
                try:
                    reply = await client.step(reset.episode_id, action)
                except PalaestraError as exc:
                    if exc.status == 422:
                        raise _Refused(
                            f"action {i} ({action.tool}) was refused: {exc.message}"
                        ) from None
                    raise
                if reply.terminated or reply.truncated:
                    break
            return await client.verify(reset.episode_id)
        finally:
            with contextlib.suppress(Exception):
                await client.close(reset.episode_id)

    runner = asyncio.ensure_future(play())
    done, _ = await asyncio.wait({runner}, timeout=timeout_s)
    if not done:
        runner.cancel()
        await asyncio.wait({runner}, timeout=GRACE_S)
        if episode_id and runner.done():  # else the episode is wedged: shutdown voids it
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.close(episode_id[0]), GRACE_S)
        return EpisodeRun(error=f"timeout after {timeout_s:g} s")
    try:
        return EpisodeRun(verdict=runner.result())
    except _Refused as exc:
        return EpisodeRun(error=str(exc), refused=True)
    except PalaestraError as exc:
        return EpisodeRun(error=f"the server refused the episode ({exc.code}): {exc.message}")
    except Exception as exc:
        return EpisodeRun(error=f"the episode failed: {type(exc).__name__}: {exc}")


class _Refused(Exception):
    pass


def _failure(label: str, run: EpisodeRun, timeout_s: float) -> str | None:
    """The problem with an episode that did not give an ok verdict, or None."""
    if run.error is not None:
        if run.error.startswith("timeout"):
            return (
                f"the {label} episode did not finish within {timeout_s:g} s (the verifier or "
                "the environment hangs); make it finish, or raise [checks] timeout_s"
            )
        return f"the {label} episode failed: {run.error}"
    assert run.verdict is not None
    if run.verdict.status == "void":
        reason = run.verdict.feedback
        if "verifier crashed" in reason:
            return (
                f"the verifier crashed on the {label} episode ({reason}); the episode was "
                "void — fix the family's verify() or the task's private data"
            )
        if reason.startswith("judge unavailable"):
            return (
                f"the {label} episode was void ({reason}); give the check a judge endpoint of "
                "that name (`pack check --judge NAME=URL,MODEL`, or the `judges` setting)"
            )
        return f"the {label} episode was void ({reason}); fix the environment or the sandbox"
    return None


def _verdict_key(v: Verdict) -> tuple[float, bool, dict[str, float]]:
    return (round(v.reward, 9), v.passed, {k: round(x, 9) for k, x in v.components.items()})


async def _check_task(
    client: AsyncInProcessClient,
    pack: Pack,
    task: Task,
    family: Family,
    timeout_s: float,
    report: CheckReport,
    extra_cheats: Sequence[GenericCheat] = (),
    cheats_only: bool = False,
) -> None:
    """Play the task's checks; `cheats_only`: the family's and the library's cheats alone
    (publish's audit)."""
    assert pack.manifest is not None
    checks = pack.manifest.checks
    problems = report.problems

    def fail(check: str, message: str) -> None:
        problems.append(Problem(where=task.id, check=check, message=message))

    result = report.results.setdefault(task.id, TaskResult(task.id, task.split))

    async def play(label: str, script: Script, generic: bool = False) -> Verdict | None:
        run = await play_episode(client, task, script, timeout_s)
        report.episodes += 1
        if generic and run.refused:  # the tools refuse this form: it cannot score
            result.cheats[label.removeprefix("cheat:")] = 0.0
            result.refused[label.removeprefix("cheat:")] = run.error or "refused"
            return None
        problem = _failure(label, run, timeout_s)
        if run.verdict is not None and run.verdict.status == "void":
            result.void[label] = run.verdict.feedback
        reward = None if problem else run.verdict.reward if run.verdict else None
        if label.startswith("cheat:"):
            result.cheats[label.removeprefix("cheat:")] = reward
        elif label in ("oracle", "rerun", "null"):
            setattr(result, label, reward)
        if problem:
            fail(label, problem)
            return None
        return run.verdict

    generic = True
    if not cheats_only:
        await _prove(pack, task, family, result, play, fail)
        # A verifier that gives no verdict to the null agent would fail every generic play
        # the same way: its problem is reported once, by the null check.
        generic = result.null is not None
    if not generic:
        report.notes.append(f"{task.id}: generic cheats not played (the null agent got no verdict)")
    try:
        cheats = [cheatlib.LibraryPlay("", name, actions) for name, actions in family.cheats(task)]
    except Exception as exc:
        fail("cheat", f"{family.name}.cheats() raised {type(exc).__name__}: {exc}")
        cheats = []
    own = {c.name for c in cheats}
    try:
        surface = family.cheat_surface(task)
        plays = cheatlib.plays_for(task, surface, extra_cheats) if generic else []
        cheats += [p for p in plays if p.name not in own]
    except Exception as exc:
        fail("cheat", f"the generic cheats of {family.name} raised {type(exc).__name__}: {exc}")
    for cheat in cheats:
        name, kind = cheat.name, cheat.kind or None
        if kind is not None:
            report.generic[name] = kind
        verdict = await play(f"cheat:{name}", cheat.script, generic=kind is not None)
        if cheat.domain_limit is not None:  # judged by its mean over the domain
            reward = result.cheats.pop(name, None)
            result.domain_cheats[name] = reward
            if reward is not None:
                report.add_domain_play(task.domain, name, kind or "", cheat.domain_limit, reward)
            continue
        if verdict is None or verdict.reward <= checks.cheat_max_reward + 1e-9:
            continue
        if name in checks.allow_cheats or kind in checks.allow_cheats:
            report.allowed.setdefault(name, []).append(task.id)
            continue
        what = f"generic cheat {name!r} (library class {kind})" if kind else f"known cheat {name!r}"
        report.over_limit.append(
            OverLimit(
                name, kind, task.id, verdict.reward, checks.cheat_max_reward, verdict.feedback
            )
        )
        fail(
            f"cheat:{name}",
            f"the {what} scored {verdict.reward:.3f} > {checks.cheat_max_reward:g} "
            f"({verdict.feedback}); harden the tests/verifier, or list it under "
            "[checks.allow_cheats] with the reason",
        )


async def _prove(
    pack: Pack,
    task: Task,
    family: Family,
    result: TaskResult,
    play: Callable[[str, Script], Awaitable[Verdict | None]],
    fail: Callable[[str, str], None],
) -> None:
    """The oracle reaches the expected reward, a rerun gives the same verdict, null scores 0."""
    expected = pack.expected_reward(task.id)
    result.expected = expected
    try:
        oracle = family.oracle(task)
    except Exception as exc:
        fail(
            "oracle",
            f"{family.name}.oracle() raised {type(exc).__name__}: {exc}; "
            "the task's private fields lack what the oracle needs",
        )
        oracle = None
    if oracle is not None:
        first = await play("oracle", oracle)
        if first is not None and first.reward < expected - 1e-9:
            fail(
                "oracle",
                f"the oracle scored {first.reward:.3f} < the expected {expected:.3f} "
                f"({first.feedback}); fix the solution or the tests, or lower expected_reward",
            )
        if first is not None:
            second = await play("rerun", family.oracle(task))
            if second is not None and _verdict_key(second) != _verdict_key(first):
                fail(
                    "rerun",
                    f"a rerun of the oracle gave {_verdict_key(second)}, the first run "
                    f"{_verdict_key(first)}; the verifier must give the same verdict for the "
                    "same final state",
                )
    null = await play("null", family.null(task))
    if null is not None and null.reward > 0:
        fail(
            "null",
            f"the null agent scored {null.reward:.3f}, not 0 ({null.feedback}); the verifier "
            "must not reward doing nothing",
        )


def choose_tasks(pack: Pack, limit: int | None, seed: int = 0) -> list[Task]:
    """All tasks by id, or a fixed sample of `limit` of them (spread over every split)."""
    tasks = [pack.tasks[k] for k in sorted(pack.tasks)]
    if limit is None or limit >= len(tasks):
        return tasks
    return sorted(random.Random(seed).sample(tasks, limit), key=lambda t: t.id)


async def check_pack(
    root: Path,
    *,
    limit: int | None = None,
    concurrency: int = 4,
    timeout_s: float | None = None,
    extra_families: Iterable[Family] = (),
    sandbox: str | None = None,
    on_task: Callable[[Task], None] | None = None,
    judges: Mapping[str, Any] | None = None,
    extra_cheats: Sequence[GenericCheat] = (),
    on_start: Callable[[int], None] | None = None,
) -> CheckReport:
    """Prove the pack at `root` (see the module docstring); never raises for a bad pack.

    `on_start(n)` once the pack is loaded and n tasks are chosen, `on_task(task)` as each
    is checked: the CLI's progress.

    `judges`: the judge endpoints by name (the `judges` setting's shape) that the embedded
    server gives families whose verifier asks a judge. `extra_cheats`: generic cheat classes
    played beside the library's (envs/cheatlib.py)."""
    root = Path(root)
    report = CheckReport(root=root)
    families = FamilyRegistry.discover()
    for extra in extra_families:
        families.add(extra)
    names = families.all()  # Family objects: the loader also checks each task's fields
    broken = families.unavailable()  # one problem per broken family its tasks use
    pack, problems = inspect_pack(root, names, broken=broken)
    report.problems.extend(_load_problem(root, p) for p in problems)
    if pack is None:
        return report
    assert pack.manifest is not None
    report.pack = f"{pack.name}@{pack.version}"
    report.digest = pack.digest
    report.allow_reasons = dict(pack.manifest.checks.allow_cheats)
    report.cheat_max = pack.manifest.checks.cheat_max_reward
    report.tasks = len(pack.tasks)
    if not (root / LOCK_FILE).exists():
        report.notes.append(f"no {LOCK_FILE} yet: `palaestra pack build` writes it")
    again, _ = inspect_pack(root, names, broken=broken)
    if again is not None:
        for task_id in sorted(pack.tasks.keys() | again.tasks.keys()):
            a, b = pack.tasks.get(task_id), again.tasks.get(task_id)
            if a is None or b is None or a.digest != b.digest:
                report.problems.append(
                    Problem(
                        task_id,
                        "determinism",
                        "loading the pack twice gave a different task; generators and "
                        "sources must depend only on (seed, index, level)",
                    )
                )
    chosen = choose_tasks(pack, limit)
    if on_start is not None:
        on_start(len(chosen))
    values: dict[str, Any] = {"packs_dirs": []}
    if sandbox is not None:
        values["sandbox"] = sandbox
    if judges:
        values["judges"] = dict(judges)
    await play_tasks(
        pack,
        families,
        chosen,
        report,
        settings=Settings(**values),
        concurrency=concurrency,
        timeout_s=timeout_s,
        on_task=on_task,
        extra_cheats=extra_cheats,
    )
    order = {"load": 0, "lock": 1, "determinism": 2}
    report.problems.sort(key=lambda p: (order.get(p.check, 3), p.where))
    return report


async def play_tasks(
    pack: Pack,
    families: FamilyRegistry,
    chosen: Sequence[Task],
    report: CheckReport,
    *,
    settings: Settings,
    concurrency: int = 4,
    timeout_s: float | None = None,
    on_task: Callable[[Task], None] | None = None,
    extra_cheats: Sequence[GenericCheat] = (),
    cheats_only: bool = False,
) -> None:
    """Play the checks of `chosen` tasks of a loaded `pack` through an embedded manager built
    from `settings` (its own temporary data dir and SQLite store, no packs of its own)."""
    assert pack.manifest is not None
    if not chosen:
        return
    timeout = timeout_s if timeout_s is not None else pack.manifest.checks.timeout_s
    with tempfile.TemporaryDirectory(prefix="palaestra-check-") as tmp:
        own = {
            "data_dir": Path(tmp),
            "store": "",
            "packs_dirs": [],
            "heldout_secret_file": None,
            "ray": "",
        }
        built = settings.model_copy(update=own)
        manager = await asyncio.to_thread(build_manager, built, families=families)
        manager.packs.add(pack)
        await manager.start()
        client = AsyncInProcessClient(manager)
        gate = asyncio.Semaphore(max(1, concurrency))

        async def one(task: Task) -> None:
            async with gate:
                family = families.get(task.family)
                await _check_task(
                    client, pack, task, family, timeout, report, extra_cheats, cheats_only
                )
                report.checked += 1
                if on_task is not None:
                    on_task(task)

        try:
            await asyncio.gather(*(one(t) for t in chosen))
        finally:
            await manager.shutdown()
    report.judge_domains(set(pack.manifest.checks.allow_cheats))


def audit_pack(pack: Pack, families: FamilyRegistry, settings: Settings, limit: int) -> CheckReport:
    """Publish's audit (blocking; run on an install thread): the family's cheats and the
    generic library on a fixed sample of `limit` tasks of a loaded pack, in sandboxes of the
    server's backend. The report's `over_limit` lists every cheat over `cheat_max_reward`."""
    assert pack.manifest is not None
    report = CheckReport(root=pack.root, pack=f"{pack.name}@{pack.version}", digest=pack.digest)
    report.cheat_max = pack.manifest.checks.cheat_max_reward
    report.allow_reasons = dict(pack.manifest.checks.allow_cheats)
    report.tasks = len(pack.tasks)
    chosen = choose_tasks(pack, limit)
    asyncio.run(play_tasks(pack, families, chosen, report, settings=settings, cheats_only=True))
    return report
