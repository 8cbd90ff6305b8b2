"""Regrade (`POST /v1/episodes/{id}/regrade`, server/regrade.py, server/final_state.py): the
final state a verifier saw is kept, and a newer pack version's verifier grades it again
without rerunning the policy. A tiny coding pack is published in two versions whose hidden
tests differ (1.1.0 is stricter on one task, more lenient on the other); real bwrap
sandboxes (docker where its engine and image are), the real app over a real manager."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from conftest import docker_skip_reason, make_settings

from palaestra.sandbox.docker import BASE_IMAGE
from palaestra.sdk.errors import ConflictError
from palaestra.sdk.models import Action, RegradeRequest, ResetRequest, StepRequest
from palaestra.server.config import REPO_PACKS
from palaestra.server.final_state import FOLDER, FinalStateRecord, FinalStates
from palaestra.server.manager import EpisodeManager
from palaestra.server.runtime import build_manager
from palaestra.server.sealed import WITHHELD
from palaestra.server.settings.serving import StoreSettings
from tests.redteam.publishers import client as publisher
from tests.redteam.publishers import publish
from tests.redteam.tenants import Tenant, tenant

DOCKER_SKIP = docker_skip_reason(BASE_IMAGE)
ECHO_PACK = REPO_PACKS / "echo"
PACK = "test/regrade-coding"
SECRET_CASE = "candidate(40, 2) == 42"  # in the sealed task's hidden tests only

ADD = '''def add(a, b):
    """Return the sum of a and b.
    >>> add(1, 2)
    3
    """
'''
DOUBLE = '''def double(x):
    """Return twice x.
    >>> double(2)
    4
    """
'''
# 1.0.0 checks only positive ints; 1.1.0 also negatives (stricter for `add`) and drops
# the float case of `double` (more lenient).
TESTS = {
    "1.0.0": {
        "add": "def check(candidate):\n    assert candidate(2, 3) == 5\n",
        "double": "def check(candidate):\n    assert candidate(3) == 6\n"
        "    assert candidate(0.5) == 1.0\n",
        "secret": f"def check(candidate):\n    assert {SECRET_CASE}\n",
    },
    "1.1.0": {
        "add": "def check(candidate):\n    assert candidate(2, 3) == 5\n"
        "    assert candidate(-1, -2) == -3\n",
        "double": "def check(candidate):\n    assert candidate(3) == 6\n",
        "secret": f"def check(candidate):\n    assert {SECRET_CASE}\n"
        "    assert candidate(-1, -1) == -2\n",
    },
}
# The agent's answers: right on positives only, and ints only.
SLOPPY_ADD = "def add(a, b):\n    return abs(a) + abs(b)\n"
INT_DOUBLE = "def double(x):\n    return int(x) * 2\n"


def write_pack(root: Path, version: str) -> Path:
    tasks = []
    for task_id, prompt, entry, split in (
        ("add", ADD, "add", "train"),
        ("double", DOUBLE, "double", "train"),
        ("secret", ADD, "add", "heldout"),
    ):
        tasks.append(
            {
                "id": task_id,
                "family": "coding",
                "split": split,
                "public": {"prompt": prompt, "entry_point": entry},
                "private": {
                    "tests": TESTS[version][task_id],
                    "solution": "    return a + b\n" if entry == "add" else "    return x * 2\n",
                },
            }
        )
    root.mkdir(parents=True, exist_ok=True)
    (root / "pack.toml").write_text(
        f'name = "{PACK}"\nversion = "{version}"\ndescription = "regrade test pack"\n'
        'license = "MIT"\nfamilies = ["coding"]\n\n[splits.train]\nsealed = false\n\n'
        "[splits.heldout]\nsealed = true\n"
    )
    (root / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    return root


async def publish_both(manager: EpisodeManager, tmp: Path) -> None:
    from palaestra.server.packs.archive import pack_archive

    async with publisher(manager, ["publish"], orgs=("test",)) as http:
        for version in ("1.0.0", "1.1.0"):
            reply = await publish(http, pack_archive(write_pack(tmp / version, version)))
            assert reply.status_code in (200, 201), reply.text


def write(content: str, path: str = "solution.py") -> dict[str, Any]:
    return {"tool": "write_file", "arguments": {"path": path, "content": content}}


SUBMIT: dict[str, Any] = {"tool": "submit", "arguments": {}}


module_loop = pytest.mark.asyncio(loop_scope="module")  # the module's one manager


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def served(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[EpisodeManager]:
    """One manager for the module: publishing checks each version (oracle, cheats)."""
    tmp = tmp_path_factory.mktemp("regrade")
    manager = build_manager(make_settings(data_dir=tmp / "data"))
    await manager.start()
    try:
        await publish_both(manager, tmp / "packs")
        yield manager
    finally:
        await manager.shutdown()


Factory = Callable[[list[str]], Tenant]


@pytest_asyncio.fixture(loop_scope="module")
async def tenants(served: EpisodeManager) -> AsyncIterator[Factory]:
    made: list[Tenant] = []

    def make(scopes: list[str]) -> Tenant:
        made.append(tenant(served, scopes))
        return made[-1]

    yield make
    for t in made:
        await t.http.aclose()


async def play(t: Tenant, task: str, *actions: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """An episode of `task` (in 1.0.0) driven by `actions`; (its id, the last reply)."""
    eid = await t.start(task=f"{PACK}@1.0.0:{task}")
    reply: dict[str, Any] = {}
    for action in actions:
        response = await t.http.post(f"/v1/episodes/{eid}/step", json={"action": action})
        assert response.status_code == 200, response.text
        reply = response.json()
    return eid, reply


async def regrade(t: Tenant, eid: str, pack: str = f"{PACK}@1.1.0") -> Any:
    return await t.http.post(f"/v1/episodes/{eid}/regrade", json={"pack": pack})


@module_loop
async def test_a_stricter_and_a_more_lenient_verifier_flip_verdicts(tenants: Factory) -> None:
    me = tenants(["train"])
    strict, done = await play(me, "add", write(SLOPPY_ADD), SUBMIT)
    assert done["reward"] == 1.0  # 1.0.0 checks positives only
    lenient, done = await play(me, "double", write(INT_DOUBLE), SUBMIT)
    assert done["reward"] == 0.0  # 1.0.0 checks a float
    flipped = await regrade(me, strict)
    assert flipped.status_code == 200, flipped.text
    verdict = flipped.json()
    assert verdict["reward"] == 0.0 and not verdict["passed"]
    assert verdict["task_digest"] != done["info"]["verdict"]["task_digest"]
    passed = (await regrade(me, lenient)).json()
    assert passed["reward"] == 1.0 and passed["passed"]
    # Regraded against the same version: the same verdict. The episode's own is unchanged.
    same = (await regrade(me, strict, f"{PACK}@1.0.0")).json()
    assert same["reward"] == 1.0
    state = (await me.http.get(f"/v1/episodes/{strict}")).json()
    assert state["verdict"]["reward"] == 1.0 and state["status"] == "done"
    # `org/name` alone is the newest version.
    assert (await regrade(me, strict, PACK)).json()["reward"] == 0.0


@module_loop
async def test_bad_requests_answer_404_409_and_422(tenants: Factory) -> None:
    me, stranger = tenants(["train"]), tenants(["train"])
    eid, _ = await play(me, "add", write(SLOPPY_ADD), SUBMIT)
    foreign, unknown = await regrade(stranger, eid), await regrade(stranger, "0" * 32)
    assert foreign.status_code == unknown.status_code == 404
    blank = foreign.json()["error"]["message"].replace(eid, "<id>")
    assert blank == unknown.json()["error"]["message"].replace("0" * 32, "<id>")
    # No such task in that pack, no such version: 422 naming it.
    other = await regrade(me, eid, "openai/humaneval")
    assert other.status_code == 422 and other.json()["error"]["code"] == "no_such_task"
    missing = await regrade(me, eid, f"{PACK}@9.9.9")
    assert missing.status_code == 422 and "9.9.9" in missing.json()["error"]["message"]
    assert (await regrade(me, eid, "no-slash")).status_code == 422  # the request's shape
    # Live, closed unverified: nothing kept, 409 naming why.
    live = await me.start(task=f"{PACK}@1.0.0:add")
    early = await regrade(me, live)
    assert early.status_code == 409 and early.json()["error"]["code"] == "no_final_state"
    assert "never verified" in early.json()["error"]["message"]


@module_loop
async def test_a_sealed_regrade_stays_sealed(tenants: Factory) -> None:
    evaluator = tenants(["eval"])
    eid, done = await play(evaluator, "secret", write(SLOPPY_ADD), SUBMIT)
    assert done["reward"] == 1.0
    reply = await regrade(evaluator, eid)
    assert reply.status_code == 200, reply.text
    assert reply.json()["reward"] == 0.0
    assert WITHHELD in reply.json()["feedback"]
    assert SECRET_CASE not in reply.text and "-1, -1" not in reply.text
    # A train token may not regrade onto a sealed task (its own episode of a public one).
    trainer = tenants(["train"])
    public, _ = await play(trainer, "add", write(SLOPPY_ADD), SUBMIT)
    assert (await regrade(trainer, eid)).status_code == 404  # not its episode
    assert (await regrade(trainer, public)).status_code == 200


@module_loop
async def test_over_the_cap_nothing_is_kept_and_409_says_why(served: EpisodeManager) -> None:
    kept = served.host.final_states  # type: ignore[attr-defined]
    assert isinstance(kept, FinalStates)
    cap, cap_mb = kept.max_bytes, kept.max_mb
    kept.max_bytes, kept.max_mb = 1 << 20, 1  # as with final_state_max_mb = 1
    try:
        eid = (await served.reset(ResetRequest(task=f"{PACK}@1.0.0:add"))).episode_id
        big = "x" * (600 * 1024)
        writes = (write(big, "big-1.txt"), write(big, "big-2.txt"), write(SLOPPY_ADD))
        for action in (*writes, SUBMIT):
            await served.step(eid, StepRequest(action=Action(**action)))
    finally:
        kept.max_bytes, kept.max_mb = cap, cap_mb
    with pytest.raises(ConflictError) as refused:
        await served.regrade(eid, RegradeRequest(pack=f"{PACK}@1.1.0"))
    assert refused.value.code == "no_final_state"
    assert "over final_state_max_mb (1 MiB)" in refused.value.message


@module_loop
async def test_retention_prunes_and_409_says_so(served: EpisodeManager) -> None:
    eid = (await served.reset(ResetRequest(task=f"{PACK}@1.0.0:add"))).episode_id
    for action in (write(SLOPPY_ADD), SUBMIT):
        await served.step(eid, StepRequest(action=Action(**action)))
    raw = await served.store.final_state(eid)
    assert raw is not None
    record = FinalStateRecord.model_validate_json(raw)
    assert record.workspace and record.state and record.bytes > 0
    kept = served.settings.data_dir / FOLDER
    assert (kept / record.workspace.removeprefix("sha256:")).is_file()
    # Within the retention nothing goes; past it, everything.
    assert served.regrader.final_states.prune() == 0
    # Past it, everything goes (other tests' files too: this test runs last but one).
    days = served.settings.final_state_retention_days
    assert served.regrader.final_states.prune(now=time.time() + days * 86400 + 60) >= 2
    with pytest.raises(ConflictError) as refused:
        await served.regrade(eid, RegradeRequest(pack=f"{PACK}@1.1.0"))
    assert refused.value.code == "no_final_state"
    assert "pruned (final_state_retention_days is 30)" in refused.value.message


def test_the_settings_bound_it() -> None:
    fields = StoreSettings.model_fields
    assert fields["final_state_max_mb"].default == 64
    assert fields["final_state_retention_days"].default == 30.0


@pytest.mark.slow
@pytest.mark.skipif(bool(DOCKER_SKIP), reason=DOCKER_SKIP or "docker")
async def test_a_docker_episode_regrades(tmp_path: Path) -> None:
    """On docker the kept workspace comes from the engine's archive of the container and
    goes into a fresh container for the newer verifier."""
    # Published (and proved) on bwrap, which is quicker than docker's proof by 30 s; the
    # docker manager then serves the same store.
    publisher_manager = build_manager(make_settings(data_dir=tmp_path / "data"))
    await publisher_manager.start()
    try:
        await publish_both(publisher_manager, tmp_path / "packs")
    finally:
        await publisher_manager.shutdown()
    manager = build_manager(make_settings(data_dir=tmp_path / "data", sandbox="docker"))
    await manager.start()
    try:
        eid = (await manager.reset(ResetRequest(task=f"{PACK}@1.0.0:add"))).episode_id
        reply = None
        for action in (write(SLOPPY_ADD), SUBMIT):
            reply = await manager.step(eid, StepRequest(action=Action(**action)))
        assert reply is not None and reply.reward == 1.0
        verdict = await manager.regrade(eid, RegradeRequest(pack=f"{PACK}@1.1.0"))
        assert verdict.reward == 0.0 and verdict.status == "ok"
        again = await manager.regrade(eid, RegradeRequest(pack=f"{PACK}@1.0.0"))
        assert again.reward == 1.0
    finally:
        await manager.shutdown()


async def test_regrade_on_a_postgres_store(pg_url: str, tmp_path: Path) -> None:
    """The kept record's column (migration 9) on PostgreSQL: a family without a sandbox
    (echo) keeps its state alone, and a regrade reads it back."""
    settings = make_settings(data_dir=tmp_path / "data", store=pg_url, packs_dirs=[ECHO_PACK])
    manager = build_manager(settings)
    await manager.start()
    try:
        eid = (await manager.reset(ResetRequest(task="palaestra/echo:say-birch"))).episode_id
        answer = Action(tool="submit", arguments={"answer": "hcrib"})
        assert (await manager.step(eid, StepRequest(action=answer))).reward == 1.0
        raw = await manager.store.final_state(eid)
        assert raw is not None
        record = FinalStateRecord.model_validate_json(raw)
        assert record.workspace is None and record.state is not None
        verdict = await manager.regrade(eid, RegradeRequest(pack="palaestra/echo"))
        assert verdict.reward == 1.0 and verdict.status == "ok"
    finally:
        await manager.shutdown()
