"""The sampler (docs/sampler.md): mixture weights, curriculum, quarantine, determinism, and
`GET /v1/sampler` on a real server."""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from conftest import ServerProcess

from palaestra.envs.base import Assessment, EpisodeContext
from palaestra.envs.commentary import CommentaryFamily, CommentarySettings
from palaestra.envs.echo import EchoFamily
from palaestra.sdk.errors import NotFoundError
from palaestra.sdk.http import HTTPClient
from palaestra.sdk.models import EpisodeState
from palaestra.sdk.task import Task
from palaestra.server.config import Settings, load_settings
from palaestra.server.families import FamilyRegistry, unjudged_families
from palaestra.server.inprocess import AsyncInProcessClient
from palaestra.server.manager import EpisodeManager
from palaestra.server.packs.catalog import PackCatalog
from palaestra.server.packs.loader import Pack
from palaestra.server.runtime import build_manager
from palaestra.server.sampler import Sampler, curriculum_weight

# -- a synthetic catalog ---------------------------------------------------------------------


def make_pack(
    name: str,
    domains: dict[str, int],
    *,
    version: str = "1.0.0",
    splits: dict[str, bool] | None = None,
    family: str = "echo",
) -> Pack:
    """`domains`: {domain: task count}; every task in `train` (and one in each other split)."""
    splits = splits or {"train": False}
    tasks: dict[str, Task] = {}
    for domain, count in domains.items():
        for i in range(count):
            for split in splits:
                if split != "train" and i:
                    continue
                tid = f"{domain.replace('/', '-')}-{split}-{i}"
                tasks[tid] = Task(
                    id=tid,
                    family=family,
                    domain=domain,
                    split=split,
                    pack=name,
                    version=version,
                    public={},
                    private={},
                    sealed=splits[split],
                )
    return Pack(
        name=name,
        version=version,
        description="",
        license="",
        families=[family],
        sealed=dict(splits),
        digest="sha256:test",
        root=Path("."),
        tasks=tasks,
    )


def sampler_over(*packs: Pack, clock: list[float] | None = None, **settings: object) -> Sampler:
    catalog = PackCatalog()
    for pack in packs:
        catalog.add(pack)
    now = clock if clock is not None else [1e9]
    return Sampler(Settings.model_validate(settings), catalog, clock=lambda: now[0])


def draw(sampler: Sampler, n: int, seed: int = 0, **filters: str) -> Counter[str]:
    rng = random.Random(seed)
    return Counter(sampler.sample(rng, **filters)[0].ref for _ in range(n))


def chi_square(observed: dict[str, int], expected: dict[str, float]) -> float:
    n = sum(observed.values())
    return sum((observed.get(k, 0) - n * p) ** 2 / (n * p) for k, p in expected.items())


# -- mixture ----------------------------------------------------------------------------------


def test_mixture_respects_pack_and_domain_weights() -> None:
    sampler = sampler_over(
        make_pack("org/a", {"a/x": 3}),
        make_pack("org/b", {"b/x": 2, "b/y": 5}),
        make_pack("org/wide", {f"wide/d{i}": 2 for i in range(100)}),
        sampler_weights={"org/b": 2.0, "b/y": 3.0, "org/wide": 1.0},
    )
    n = 20_000
    counts = draw(sampler, n)
    by_domain: Counter[str] = Counter()
    for ref, c in counts.items():
        pack, tid = ref.split("@")[0], ref.split(":")[1]
        by_domain["wide" if pack == "org/wide" else tid.rsplit("-", 2)[0]] += c
    # P(pack) = 1:2:1; within org/b, P(domain) = 1:3; the 100-domain pack gets only its 1/4.
    expected = {"a-x": 0.25, "b-x": 0.5 * 0.25, "b-y": 0.5 * 0.75, "wide": 0.25}
    assert chi_square(by_domain, expected) < 16.3, by_domain  # 3 dof, p = 0.001
    # within a domain (no outcomes yet) the tasks are uniform
    b_y = {k: v for k, v in counts.items() if ":b-y-train-" in k}
    assert len(b_y) == 5
    assert chi_square(b_y, {k: 0.2 for k in b_y}) < 18.5  # 4 dof, p = 0.001


def test_reported_probability_matches_draws() -> None:
    sampler = sampler_over(make_pack("org/a", {"a/x": 2, "a/y": 1}), sampler_weights={"a/y": 3.0})
    rng = random.Random(1)
    probs: dict[str, float] = {}
    counts: Counter[str] = Counter()
    for _ in range(8000):
        task, p = sampler.sample(rng)
        probs[task.ref] = p
        counts[task.ref] += 1
    assert sum(probs.values()) == pytest.approx(1.0)
    assert probs["org/a@1.0.0:a-y-train-0"] == pytest.approx(0.75)
    assert chi_square(counts, probs) < 13.8  # 2 dof
    report = sampler.report()
    [pack] = report.packs
    assert pack.probability == 1.0
    assert {d.domain: d.probability for d in pack.domains} == {"a/x": 0.25, "a/y": 0.75}


def test_zero_weight_and_unknown_keys() -> None:
    sampler = sampler_over(
        make_pack("org/a", {"a/x": 2}),
        make_pack("org/b", {"b/x": 2}),
        sampler_weights={"org/b": 0.0, "nope/x": 2.0},
    )
    assert all(ref.startswith("org/a@") for ref in draw(sampler, 200))
    with pytest.raises(NotFoundError, match="weighted 0"):
        sampler.sample(1, pack="org/b")
    assert sampler.report().unmatched_weights == ["nope/x"]


def test_filters_and_sealed_splits() -> None:
    sampler = sampler_over(
        make_pack(
            "org/a",
            {"a/x/easy": 3, "a/x/hard": 3, "a/y": 3},
            splits={"train": False, "heldout": True},
        )
    )
    # with no split, a sealed split is never drawn
    assert all(":a-" in r and "-train-" in r for r in draw(sampler, 500))
    held = draw(sampler, 200, split="heldout")
    assert held and all("-heldout-" in r for r in held)
    # a domain filter is a prefix on `/` boundaries
    x = draw(sampler, 300, domain="a/x")
    assert {r.split(":")[1].rsplit("-", 2)[0] for r in x} == {"a-x-easy", "a-x-hard"}
    with pytest.raises(NotFoundError):
        sampler.sample(1, domain="a/z")
    with pytest.raises(NotFoundError):
        sampler.sample(1, pack="org/none")


def test_newest_pack_version_unless_named() -> None:
    sampler = sampler_over(
        make_pack("org/a", {"a/x": 2}, version="1.0.0"),
        make_pack("org/a", {"a/x": 2}, version="1.2.0"),
    )
    assert {r.split(":")[0] for r in draw(sampler, 100)} == {"org/a@1.2.0"}
    assert {r.split(":")[0] for r in draw(sampler, 50, pack="org/a@1.0.0")} == {"org/a@1.0.0"}


def test_a_domain_over_several_public_splits() -> None:
    sampler = sampler_over(make_pack("org/a", {"a/x": 3}, splits={"train": False, "dev": False}))
    sampler.record("org/a@1.0.0:a-x-dev-0", "done", 1.0, True)
    rng = random.Random(2)
    probs: dict[str, float] = {}
    counts: Counter[str] = Counter()
    for _ in range(8000):
        task, p = sampler.sample(rng)
        probs[task.ref] = p
        counts[task.ref] += 1
    assert len(probs) == 4 and sum(probs.values()) == pytest.approx(1.0)
    assert chi_square(counts, probs) < 16.3  # 3 dof


def test_a_pack_published_later_is_indexed() -> None:
    catalog = PackCatalog()
    catalog.add(make_pack("org/a", {"a/x": 2}))
    sampler = Sampler(Settings(), catalog)
    sampler.record("org/a@1.0.0:a-x-train-0", "done", 1.0, True)
    assert {r.split("@")[0] for r in draw(sampler, 50)} == {"org/a"}
    catalog.add(make_pack("org/b", {"b/x": 2}))
    catalog.add(make_pack("org/a", {"a/x": 2}, version="2.0.0"))
    assert {r.split(":")[0] for r in draw(sampler, 200)} == {"org/a@2.0.0", "org/b@1.0.0"}
    assert [t.task for t in sampler.report(pack="org/a@1.0.0").tasks] == ["org/a@1.0.0:a-x-train-0"]


def test_seed_makes_the_choice_deterministic() -> None:
    def fresh() -> Sampler:
        s = sampler_over(make_pack("org/a", {f"a/d{i}": 20 for i in range(10)}))
        for i in range(30):
            s.record(f"org/a@1.0.0:a-d{i % 10}-train-{i % 7}", "done", 1.0, i % 3 == 0)
        return s

    one, two = fresh(), fresh()
    picks = [one.sample(seed)[0].ref for seed in range(50)]
    assert picks == [two.sample(seed)[0].ref for seed in range(50)]
    assert picks == [one.sample(seed)[0].ref for seed in range(50)]  # drawing changes no state
    assert len(set(picks)) > 10


# -- curriculum -------------------------------------------------------------------------------


def test_curriculum_prefers_the_frontier() -> None:
    sampler = sampler_over(make_pack("org/a", {"a/x": 4}))
    mid, solved, unsolved, unseen = (f"org/a@1.0.0:a-x-train-{i}" for i in range(4))
    for i in range(20):
        sampler.record(mid, "done", float(i % 2), bool(i % 2))
        sampler.record(solved, "done", 1.0, True)
        sampler.record(unsolved, "done", 0.0, False)
    counts = draw(sampler, 20_000)
    floor = sampler.floor
    # weights: the frontier 1, never-seen 1 (prior p = 0.5), solved/unsolved near the floor
    assert counts[mid] > 6 * counts[solved] and counts[mid] > 6 * counts[unsolved]
    assert counts[unseen] > 6 * counts[solved]
    total_w = sum(sampler.report().tasks[i].weight for i in range(3)) + 1.0
    for ref in (solved, unsolved):
        assert counts[ref] >= 0.7 * 20_000 * floor / total_w  # still seen, at least the floor
    info = {t.task: t for t in sampler.report().tasks}
    assert info[mid].success_rate == pytest.approx(0.5)
    assert info[solved].success_rate == pytest.approx(21 / 22)
    assert info[solved].weight == pytest.approx(curriculum_weight(21 / 22, 2.0, floor))
    assert info[solved].weight >= floor and info[mid].weight == pytest.approx(1.0)
    assert sum(t.probability for t in info.values()) + 1 / total_w == pytest.approx(1.0)


def test_curriculum_off_is_uniform_and_window_forgets() -> None:
    off = sampler_over(make_pack("org/a", {"a/x": 2}), sampler_curriculum=False)
    for _ in range(10):
        off.record("org/a@1.0.0:a-x-train-0", "done", 1.0, True)
    counts = draw(off, 4000)
    assert chi_square(counts, dict.fromkeys(counts, 0.5)) < 10.8
    on = sampler_over(make_pack("org/a", {"a/x": 2}), sampler_window=4)
    ref = "org/a@1.0.0:a-x-train-0"
    for _ in range(10):
        on.record(ref, "done", 1.0, True)
    for _ in range(2):
        on.record(ref, "done", 0.0, False)
    [stats] = on.report().tasks
    assert (stats.n, stats.passes, stats.episodes) == (4, 2, 12)
    assert stats.weight == pytest.approx(1.0)


def test_closed_and_expired_are_ignored() -> None:
    sampler = sampler_over(make_pack("org/a", {"a/x": 2}))
    for status in ("closed", "expired"):
        sampler.record("org/a@1.0.0:a-x-train-0", status, 0.0, False)
    for _ in range(5):  # voids the server caused itself say nothing about the task
        sampler.record("org/a@1.0.0:a-x-train-0", "void", 0.0, False, reason="server shut down")
    assert sampler.report().tasks == [] and sampler.quarantined_count() == 0


# -- quarantine -------------------------------------------------------------------------------


def test_quarantine_after_voids_then_cool_down_and_release() -> None:
    clock = [1000.0]
    sampler = sampler_over(make_pack("org/a", {"a/x": 3}), clock=clock, sampler_quarantine_s=60)
    bad = "org/a@1.0.0:a-x-train-0"
    sampler.record(bad, "void", 0.0, False, reason="verifier crashed", at=1000.0)
    sampler.record(bad, "done", 1.0, True, at=1001.0)
    sampler.record(bad, "void", 0.0, False, reason="verifier crashed", at=1002.0)
    assert sampler.quarantined_count() == 0
    sampler.record(bad, "void", 0.0, False, reason="verifier crashed (RuntimeError)", at=1003.0)
    assert sampler.quarantined_count() == 1
    note = sampler.quarantine_note(bad)
    assert note and "3 of its last 4" in note and "RuntimeError" in note
    clock[0] = 1010.0
    assert bad not in draw(sampler, 500)
    [q] = sampler.report().quarantined
    assert (q.task, q.voids, q.since, q.until) == (bad, 3, 1003.0, 1063.0)
    assert sampler.report().packs[0].domains[0].quarantined == 1
    clock[0] = 1064.0  # the cool-down ends
    sampler.refresh()
    assert sampler.quarantined_count() == 0
    assert bad in draw(sampler, 500)
    # on probation: its void history starts afresh; an admin release works too
    for _ in range(3):
        sampler.record(bad, "void", 0.0, False, reason="sandbox failed")
    assert sampler.quarantined_count() == 1
    assert sampler.release(bad) and not sampler.release(bad)
    assert bad in draw(sampler, 500)


def test_quarantining_a_whole_domain_moves_its_share() -> None:
    sampler = sampler_over(make_pack("org/a", {"a/x": 1, "a/y": 2}), sampler_quarantine_s=0)
    for _ in range(3):
        sampler.record("org/a@1.0.0:a-x-train-0", "void", 0.0, False, reason="boom")
    assert {r.split(":")[1][:3] for r in draw(sampler, 300)} == {"a-y"}
    with pytest.raises(NotFoundError, match="quarantined"):
        sampler.sample(1, domain="a/x")
    assert sampler.report().quarantined[0].until is None  # 0: until an admin releases it


def test_weights_from_the_environment() -> None:
    settings = load_settings(
        environ={"PALAESTRA_SAMPLER_WEIGHTS": "openai/humaneval=1, reasoning/arc_1d=2"},
        config_file=Path("/nonexistent.toml"),
    )
    assert settings.sampler_weights == {"openai/humaneval": 1.0, "reasoning/arc_1d": 2.0}
    settings = load_settings(
        environ={"PALAESTRA_SAMPLER_WEIGHTS": json.dumps({"a/b": 0.5})},
        config_file=Path("/nonexistent.toml"),
    )
    assert settings.sampler_weights == {"a/b": 0.5}
    with pytest.raises(ValueError):
        Settings(sampler_void_limit=6, sampler_void_window=5)


# -- in the manager: real episodes, a verifier that crashes ----------------------------------


class VerifyCrashFamily(EchoFamily):
    name = "test-sampler-crash"
    description = "echo whose verifier crashes on the answer 'crash'"

    async def verify(self, ctx: EpisodeContext) -> Assessment:
        if ctx.state.answer == "crash":
            raise RuntimeError("the verifier fell over")
        return await super().verify(ctx)


def write_pack(root: Path) -> None:
    root.mkdir(parents=True)
    (root / "pack.toml").write_text(
        'name = "test/sampled"\nversion = "0.1.0"\nfamilies = ["test-sampler-crash"]\n\n'
        "[splits.train]\nsealed = false\n"
    )
    tasks = [
        {
            "id": f"t{i}",
            "family": VerifyCrashFamily.name,
            "domain": "sampled/echo",
            "split": "train",
            "difficulty": "easy",
            "public": {"instruction": "Submit 'ok'."},
            "private": {"answer": "ok"},
        }
        for i in range(2)
    ]
    (root / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))


async def started(tmp_path: Path) -> EpisodeManager:
    if not (tmp_path / "packs").exists():
        write_pack(tmp_path / "packs" / "sampled")
    manager = build_manager(
        Settings(data_dir=tmp_path / "data", packs_dirs=[], sampler_quarantine_s=0)
    )
    manager.families.add(VerifyCrashFamily())
    manager.packs.load_dirs([tmp_path / "packs"], [f.name for f in manager.families.all()])
    assert not manager.packs.errors, manager.packs.errors
    await manager.start()
    return manager


@pytest.fixture
async def sampled(tmp_path: Path) -> AsyncIterator[EpisodeManager]:
    manager = await started(tmp_path)
    try:
        yield manager
    finally:
        await manager.shutdown()


async def run(client: AsyncInProcessClient, answer: str, task: str | None = None) -> str:
    reset = await client.reset(task, pack=None if task else "test/sampled")
    reply = await client.step(reset.episode_id, {"tool": "submit", "arguments": {"answer": answer}})
    assert reply.terminated
    return str(reset.info["task"])


async def test_manager_records_outcomes_and_quarantines(
    sampled: EpisodeManager, tmp_path: Path
) -> None:
    client = AsyncInProcessClient(sampled)
    t0, t1 = "test/sampled@0.1.0:t0", "test/sampled@0.1.0:t1"
    reset = await client.reset(pack="test/sampled", seed=3)
    assert reset.info["sampled"]["probability"] == pytest.approx(0.5)
    await client.close(reset.episode_id)  # closed without a verdict: not counted
    await run(client, "ok", t1)
    await run(client, "wrong", t1)
    for _ in range(3):
        await run(client, "crash", t0)
    report = await client.sampler()
    assert [q.task for q in report.quarantined] == [t0]
    assert "verifier crashed" in report.quarantined[0].reason
    stats = {t.task: t for t in report.tasks}
    assert (stats[t1].n, stats[t1].passes, stats[t1].success_rate) == (2, 1, 0.5)
    assert stats[t0].quarantined and stats[t0].probability == 0.0
    assert b"palaestra_tasks_quarantined 1.0" in sampled.metrics.render()
    for seed in range(20):  # never drawn while quarantined ...
        reset = await client.reset(pack="test/sampled", seed=seed)
        assert reset.info["task"] == t1 and reset.info["sampled"]["probability"] == 1.0
        await client.close(reset.episode_id)
    reset = await client.reset(t0)  # ... but runs when asked for by name, and says so
    assert "holds it back" in reset.info["quarantined"]
    await client.close(reset.episode_id)

    # a restart rebuilds the stats and the quarantine from the store
    await sampled.shutdown()
    again = await started(tmp_path)
    try:
        client = AsyncInProcessClient(again)
        report = await client.sampler()
        assert [q.task for q in report.quarantined] == [t0]
        assert {t.task: t.n for t in report.tasks}[t1] == 2
        released = await client.release_task("test/sampled:t0")
        assert released.task == t0 and released.released
        assert not (await client.release_task(t0)).released
        seen = set()
        for seed in range(20):
            reset = await client.reset(pack="test/sampled", seed=seed)
            seen.add(reset.info["task"])
            await client.close(reset.episode_id)
        assert seen == {t0, t1}
        with pytest.raises(NotFoundError):
            await client.release_task("test/sampled:nope")
    finally:
        await again.shutdown()
    third = await started(tmp_path)  # the admin release survives a restart too
    try:
        assert third.sampler.quarantined_count() == 0
    finally:
        await third.shutdown()
    sampled.store.close()


# -- over HTTP --------------------------------------------------------------------------------


@pytest.fixture
def admin_http(server: ServerProcess) -> Iterator[HTTPClient]:
    token_file = server.data_dir / "admin.token"
    token = token_file.read_text().strip() if token_file.exists() else None
    with HTTPClient(server.url, token=token) as client:
        yield client


def test_sampler_over_http(admin_http: HTTPClient) -> None:
    http = admin_http
    report = http.sampler()
    packs = {p.pack.split("@")[0]: p for p in report.packs}
    assert "palaestra/echo" in packs and report.curriculum and report.quarantined == []
    assert sum(p.probability for p in report.packs) == pytest.approx(1.0)
    reset = http.reset(pack="palaestra/echo", seed=7)
    assert reset.info["split"] == "train" and 0 < reset.info["sampled"]["probability"] <= 1
    answer = str(reset.info["task"])  # a wrong answer: the episode is verified, reward 0
    reply = http.step(reset.episode_id, {"tool": "submit", "arguments": {"answer": answer}})
    assert reply.terminated and reply.reward == 0.0
    report = http.sampler(pack="palaestra/echo")
    assert report.filters == {"pack": "palaestra/echo"}
    [task] = [t for t in report.tasks if t.task == reset.info["task"]]
    assert (task.n, task.passes) == (1, 0) and task.success_rate == pytest.approx(1 / 3)
    assert http.release_task(str(reset.info["task"])).released is False
    assert http.sampler(domain="nope").packs == []
    state: EpisodeState = http.state(reset.episode_id)
    assert state.status == "done"


def test_a_family_whose_judge_is_unconfigured_is_never_drawn(tmp_path: Path) -> None:
    """Its episodes could only end void (no judge): drawn once the judge is configured."""
    a = make_pack("org/a", {"a/x": 2})
    b = make_pack("org/b", {"b/x": 2}, family="finance-commentary")
    families = FamilyRegistry(
        [EchoFamily(), CommentaryFamily(CommentarySettings(cache_dir=tmp_path))]
    )
    bare = Settings()
    assert unjudged_families(bare, families) == frozenset({"finance-commentary"})
    catalog = PackCatalog()
    catalog.add(a)
    catalog.add(b)
    sampler = Sampler(bare, catalog, unjudged=unjudged_families(bare, families))
    assert all(ref.startswith("org/a@") for ref in draw(sampler, 200))
    with pytest.raises(NotFoundError, match="judge endpoint is not configured"):
        sampler.sample(1, pack="org/b")
    judged = Settings.model_validate(
        {"judges": {"default": {"url": "http://127.0.0.1:9/v1", "model": "m"}}}
    )
    assert unjudged_families(judged, families) == frozenset()
    drawn = draw(Sampler(judged, catalog, unjudged=frozenset()), 200)
    assert any(ref.startswith("org/b@") for ref in drawn)
