"""Sealed stays sealed: what an evaluator (or a trainer) can learn of a held-out task.

Attacks, each on the real app over a real manager and real bwrap sandboxes:
- a wrong answer on a sealed terminal task whose test.sh prints the expected value when it
  fails (the verifier's output went into `feedback`: the verdict, the ending step's reply,
  its replay, the trajectory and the batch route all carried the expected answer);
- a train token reading the sampler's per-task results of a sealed split;
- recomputing a generated held-out task from its id and the public generator code
  (tests/redteam/test_heldout_secret.py).
The same task on a public split keeps its full feedback (so the attack is real, and the
seal is the split's, not the family's).
"""

from __future__ import annotations

import json
import logging
import shutil
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from palaestra.sandbox.bwrap import bwrap_available
from palaestra.server.config import REPO_PACKS, Settings
from palaestra.server.sealed import WITHHELD

SECRET = "LEAK-3f9a1c-the-expected-answer"
TEST_SH = (
    'expected="' + SECRET + '"\n'
    'got="$(cat "$WORKDIR/answer.txt" 2>/dev/null)"\n'
    '[ "$got" = "$expected" ] && exit 0\n'
    'echo "wrong: expected $expected, got $got"\n'
    "exit 1\n"
)
OK, WHY = bwrap_available()


def leaky_task(task_id: str, split: str) -> dict[str, Any]:
    return {
        "id": task_id,
        "family": "terminal",
        "split": split,
        "public": {"instruction": "Write the answer to answer.txt."},
        "private": {"verifier": {"test.sh": TEST_SH}},
    }


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    packs = tmp_path / "packs"
    shutil.copytree(REPO_PACKS / "echo", packs / "echo")
    leaky = packs / "leaky"
    leaky.mkdir()
    (leaky / "pack.toml").write_text(
        'name = "acme/leaky"\nversion = "1.0.0"\nfamilies = ["terminal"]\n\n'
        "[splits.train]\nsealed = false\n\n[splits.heldout]\nsealed = true\n"
    )
    tasks = [leaky_task("open", "train"), leaky_task("held", "heldout")]
    (leaky / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    return Settings(data_dir=tmp_path / "data", packs_dirs=[packs], pool_size=0)


async def token(api: httpx.AsyncClient, *scopes: str) -> dict[str, str]:
    body = {"scopes": list(scopes), "name": f"rt-{'-'.join(scopes)}-{uuid.uuid4().hex[:6]}"}
    made = await api.post("/v1/tokens", json=body)
    assert made.status_code == 201, made.text
    return {"authorization": f"Bearer {made.json()['token']}"}


async def wrong_attempt(api: httpx.AsyncClient, who: dict[str, str], task: str) -> list[str]:
    """A wrong answer, submitted; every body the server answered, replays included."""
    bodies: list[str] = []

    async def call(method: str, path: str, body: Any = None) -> dict[str, Any]:
        reply = await api.request(method, path, json=body, headers=who)
        bodies.append(reply.text)
        assert reply.status_code == 200, reply.text
        out: dict[str, Any] = reply.json()
        return out

    started = await call("POST", "/v1/episodes", {"task": task})
    eid = started["episode_id"]
    bash = {"tool": "bash", "arguments": {"command": "echo not-it > answer.txt"}}
    await call("POST", f"/v1/episodes/{eid}/step", {"action": bash, "request_id": "a"})
    submit = {"action": {"tool": "submit", "arguments": {}}, "request_id": "b"}
    ended = await call("POST", f"/v1/episodes/{eid}/step", submit)
    assert ended["terminated"] and ended["reward"] == 0.0
    await call("POST", f"/v1/episodes/{eid}/verify")
    state = await call("GET", f"/v1/episodes/{eid}")
    assert state["verdict"]["passed"] is False and state["trajectory"]
    await call("POST", f"/v1/episodes/{eid}/step", submit)  # a replay of the ending step
    batch = {"items": [{"episode_id": eid, **submit}]}
    await call("POST", "/v1/batch/step", batch)
    await call("GET", "/v1/sampler", None)
    return bodies


@pytest.mark.skipif(not OK, reason=f"bwrap unavailable: {WHY}")
async def test_sealed_verdicts_never_carry_the_verifiers_output(
    api: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    evaluator = await token(api, "eval")
    # The attack is real: on the public split the verifier's output (the expected value) is
    # the feedback a trainer gets.
    public = await wrong_attempt(api, await token(api, "train"), "acme/leaky:open")
    assert any(SECRET in body for body in public)
    caplog.clear()
    sealed = await wrong_attempt(api, evaluator, "acme/leaky:held")
    for body in sealed:
        assert SECRET not in body, body
        assert "wrong: expected" not in body, body
    verdicts = [
        json.loads(b).get("verdict") or json.loads(b).get("info", {}).get("verdict") for b in sealed
    ]
    shown = [v for v in verdicts if v]
    assert shown and all(WITHHELD in v["feedback"] and "failed" in v["feedback"] for v in shown)
    assert all(v["components"].get("test_sh") == 0.0 for v in shown)  # scores stay
    assert not any(SECRET in r.getMessage() for r in caplog.records)
    # An admin (the operator) may read the verifier's own words; only while it is in memory.
    eid = json.loads(sealed[0])["episode_id"]
    admin = await api.get(f"/v1/episodes/{eid}")
    assert admin.status_code == 200, admin.text
    assert SECRET in admin.json()["sealed_feedback"]
    assert SECRET not in admin.json()["verdict"]["feedback"]  # the verdict is the same for all
    assert json.loads(sealed[4]).get("sealed_feedback") is None  # the evaluator's state


async def test_sealed_sampler_stats_are_for_eval_and_admin_tokens(api: httpx.AsyncClient) -> None:
    evaluator, trainer = await token(api, "eval"), await token(api, "train")
    for task, who in (
        ("palaestra/echo:say-apple", evaluator),
        ("palaestra/echo:say-birch", trainer),
    ):
        started = await api.post("/v1/episodes", json={"task": task}, headers=who)
        eid = started.json()["episode_id"]
        submit = {"action": {"tool": "submit", "arguments": {"answer": "nope"}}}
        assert (await api.post(f"/v1/episodes/{eid}/step", json=submit, headers=who)).is_success

    def sealed_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
        return [t for t in report["tasks"] if t["split"] == "heldout"]

    for params in ({"pack": "palaestra/echo"}, {"pack": "palaestra/echo", "split": "heldout"}, {}):
        seen = (await api.get("/v1/sampler", params=params, headers=trainer)).json()
        assert not sealed_rows(seen), seen
        assert all("say-apple" not in q["task"] for q in seen["quarantined"])
        assert any(t["task"].endswith(":say-birch") for t in seen["tasks"]) or params.get("split")
    # The sealed split's rows appear when asked for by name, to eval and admin tokens only.
    asked = {"pack": "palaestra/echo", "split": "heldout"}
    for who in (evaluator, {}):  # {}: the admin the client speaks as by default
        full = (await api.get("/v1/sampler", params=asked, headers=who)).json()
        assert [t["task"] for t in sealed_rows(full)] == ["palaestra/echo@0.1.0:say-apple"]
