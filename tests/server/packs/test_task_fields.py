"""A task whose fields do not fit its family's models is refused when its pack loads."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from palaestra.envs.coding import CodingFamily
from palaestra.envs.echo import EchoFamily, EchoPrivate
from palaestra.envs.finance import FinanceFamily
from palaestra.envs.terminal import TerminalFamily
from palaestra.sdk.errors import BadRequestError
from palaestra.server.db import Database
from palaestra.server.packcheck import check_pack
from palaestra.server.packs.archive import pack_archive
from palaestra.server.packs.loader import inspect_pack, load_pack
from palaestra.server.packs.manifest import PackError
from palaestra.server.packs.registry import PackRegistry

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


MISSING_PRIVATE = [
    {
        "id": "no-tests",
        "family": "coding",
        "public": {"prompt": "def f():\n", "entry_point": "f"},
        "private": {"solution": "    return 1\n"},
    },
    {
        "id": "no-answer",
        "family": "finance",
        "public": {"question": "What is the ratio?"},
        "private": {"document": {"kind": "generated"}},
    },
]
MISSING = {"no-tests": "neither private.tests nor verifier/tests.py", "no-answer": "private.gold"}


def test_a_missing_private_field_is_refused_at_load_check_and_publish(tmp_path: Path) -> None:
    """Not at episode time as 'verifier crashed (KeyError)': the loader, `pack check` and a
    publish each name the task and the field."""
    root = write_pack(tmp_path / "p", MISSING_PRIVATE)
    families = [CodingFamily(), FinanceFamily()]

    def named(text: str) -> bool:
        return all(task in text and field in text for task, field in MISSING.items())

    with pytest.raises(PackError) as refused:
        load_pack(root, families)
    assert named(str(refused.value)), refused.value
    report = asyncio.run(check_pack(root))
    assert not report.ok and report.checked == 0
    assert named("\n".join(f"{p.where}: {p.message}" for p in report.problems)), report.problems
    registry = PackRegistry(tmp_path / "data", Database.open(tmp_path / "data" / "db.sqlite3"))
    with pytest.raises(BadRequestError) as publish:
        registry.install(pack_archive(root), publisher="t", families=families)
    assert named(publish.value.message) and registry.published() == []
