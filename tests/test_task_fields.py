"""A task whose fields do not fit its family's models is refused when its pack loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from palaestra.envs.echo import EchoFamily, EchoPrivate
from palaestra.envs.terminal import TerminalFamily
from palaestra.server.packs.loader import inspect_pack, load_pack
from palaestra.server.packs.manifest import PackError

PACK_TOML = """\
name = "acme/fields"
version = "1.0.0"

[splits.train]
"""


def write_pack(root: Path, tasks: list[dict[str, object]]) -> Path:
    root.mkdir(parents=True)
    (root / "pack.toml").write_text(PACK_TOML)
    lines = [json.dumps({"domain": "acme/x", "split": "train", **t}) for t in tasks]
    (root / "tasks.jsonl").write_text("\n".join(lines) + "\n")
    return root


GOOD = {
    "id": "good",
    "family": "echo",
    "public": {"instruction": "say x"},
    "private": {"answer": "x"},
}


def test_a_malformed_task_is_refused_with_pack_task_and_field(tmp_path: Path) -> None:
    bad = {"id": "no-answer", "family": "echo", "public": {}, "private": {"answer": ["x"]}}
    root = write_pack(tmp_path / "p", [GOOD, bad])
    with pytest.raises(PackError) as refused:
        load_pack(root, [EchoFamily()])
    message = str(refused.value)
    assert "acme/fields" in message and "no-answer" in message and "private.answer" in message
    pack, problems = inspect_pack(root, [EchoFamily()])
    assert pack is not None and sorted(pack.tasks) == ["good"] and len(problems) == 1
    assert EchoPrivate.of(pack.tasks["good"]).answer == "x"  # what the family reads, typed


def test_a_family_checks_its_own_rules(tmp_path: Path) -> None:
    """terminal: the workdir is absolute, and a task names how it is verified."""
    tasks = [
        {
            "id": "relative",
            "family": "terminal",
            "public": {"workdir": "work"},
            "private": {"verifier": {"test.sh": "exit 0"}},
        },
        {"id": "unverifiable", "family": "terminal", "public": {}, "private": {}},
    ]
    root = write_pack(tmp_path / "t", tasks)
    pack, problems = inspect_pack(root, [TerminalFamily()])
    assert pack is not None and not pack.tasks
    assert any("relative" in p and "public.workdir" in p for p in problems), problems
    assert any("unverifiable" in p and "cannot be verified" in p for p in problems), problems


def test_names_alone_do_not_check_fields(tmp_path: Path) -> None:
    """A loader told only family names (no Family) checks what the pack format says."""
    bad = {"id": "no-answer", "family": "echo", "public": {}, "private": {}}
    pack = load_pack(write_pack(tmp_path / "p", [bad]), ["echo"])
    assert sorted(pack.tasks) == ["no-answer"]
