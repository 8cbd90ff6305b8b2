"""`palaestra pack init|check|build|list` through the real machinery (embedded manager)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from palaestra.cli.main import app
from palaestra.envs.base import Assessment, EpisodeContext
from palaestra.envs.echo import EchoFamily
from palaestra.server.config import REPO_PACKS
from palaestra.server.packcheck import CheckReport, check_pack
from palaestra.server.packs.archive import extract_archive
from palaestra.server.packs.loader import load_pack
from palaestra.server.packs.lock import LOCK_FILE
from tests.conftest import ServerProcess

runner = CliRunner()


def cli(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args), env={"COLUMNS": "200"})
    return result.exit_code, result.output


def init(tmp_path: Path, family: str = "echo", form: str = "directory") -> Path:
    root = tmp_path / f"{family}-{form}"
    code, out = cli(
        "pack", "init", str(root), "--name", f"acme/{family}", "--family", family, "--form", form
    )
    assert code == 0, out
    return root


# -- init → check ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("family", "form"),
    [("echo", "directory"), ("echo", "jsonl"), ("echo", "generators"), ("coding", "directory")],
)
def test_init_scaffold_passes_check(tmp_path: Path, family: str, form: str) -> None:
    root = init(tmp_path, family, form)
    code, out = cli("pack", "check", str(root))
    assert code == 0, out
    assert "every check passed" in out
    pack = load_pack(root)
    assert pack.name == f"acme/{family}" and pack.version == "0.1.0"
    assert {t.split for t in pack.tasks.values()} == {"train", "heldout"}
    if form == "directory":
        assert (root / "tasks").is_dir()


def test_coding_scaffold_uses_the_directory_form_files(tmp_path: Path) -> None:
    root = init(tmp_path, "coding")
    task = load_pack(root).tasks["add-numbers"]
    assert "def check(candidate)" in task.private["verifier"]["tests.py"]
    assert "return a + b" in task.private["solution"]["solution.py"]
    assert task.public["instruction"].startswith("Implement `add(a, b)`")


def test_init_refuses_bad_input(tmp_path: Path) -> None:
    code, out = cli("pack", "init", str(tmp_path / "x"), "--name", "Bad Name", "--family", "echo")
    assert code == 2 and "org/name" in out
    code, out = cli("pack", "init", str(tmp_path / "x"), "--name", "a/b", "--family", "chess")
    assert code == 2 and "no scaffold for family 'chess'" in out
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "f").write_text("x")
    code, out = cli("pack", "init", str(tmp_path / "full"), "--name", "a/b")
    assert code == 2 and "not empty" in out


# -- build -----------------------------------------------------------------------------------------
def test_build_writes_lock_and_a_deterministic_archive(tmp_path: Path) -> None:
    root = init(tmp_path, "coding")
    first, second = tmp_path / "one.tar.gz", tmp_path / "two.tar.gz"
    code, out = cli("pack", "build", str(root), "--out", str(first))
    assert code == 0, out
    lock = json.loads((root / LOCK_FILE).read_text())
    assert "tasks/add-numbers/verifier/tests.py" in lock["files"]
    time.sleep(1.1)  # a later mtime must not change the bytes
    (root / "pack.toml").touch()
    code, out = cli("pack", "build", str(root), "--out", str(second))
    assert code == 0, out
    assert first.read_bytes() == second.read_bytes()
    unpacked = extract_archive(first.read_bytes(), tmp_path / "unpacked")
    assert load_pack(unpacked).digest == load_pack(root).digest == lock["digest"]
    code, out = cli("pack", "check", str(unpacked))
    assert code == 0, out


def test_build_refuses_an_invalid_pack(tmp_path: Path) -> None:
    root = init(tmp_path)
    (root / "pack.toml").write_text((root / "pack.toml").read_text().replace("0.1.0", "1.0"))
    code, out = cli("pack", "build", str(root), "--out", str(tmp_path / "x.tar.gz"))
    assert code == 1 and "version must be semver" in out
    assert not (root / LOCK_FILE).exists() and not (tmp_path / "x.tar.gz").exists()


# -- built-in packs and list -----------------------------------------------------------------------
def test_check_builtin_echo() -> None:
    code, out = cli("pack", "check", str(REPO_PACKS / "echo"))
    assert code == 0, out


@pytest.mark.slow
def test_check_builtin_humaneval_sample() -> None:
    # All 164 tasks (7 episodes each) take about a minute on 2 cores; a fixed sample here.
    started = time.monotonic()
    code, out = cli("pack", "check", str(REPO_PACKS / "humaneval"), "--limit", "16")
    assert code == 0, out
    assert "16/164 tasks checked" in out
    assert time.monotonic() - started < 60


def test_pack_list_embedded(tmp_path: Path) -> None:
    code, out = cli("pack", "list", "--data-dir", str(tmp_path / "data"))
    assert code == 0, out
    assert "openai/humaneval" in out and "palaestra/echo" in out
    assert "heldout 33 (sealed)" in out


def test_pack_list_over_http_pages_through_tasks(server: ServerProcess) -> None:
    """`pack list --url` asks for the tasks a page at a time (the server caps a page)."""
    code, out = cli("pack", "list", "--url", server.url, "--token", server.token or "")
    assert code == 0, out
    assert "openai/humaneval" in out and "heldout 33 (sealed)" in out
    assert f"serving on {server.url}" in server.logs()  # `serve` says where it listens


def test_messages_print_verbatim(tmp_path: Path) -> None:
    """Pack and server text is never read as console markup: `[source]` stays `[source]`."""
    root = tmp_path / "empty"
    root.mkdir()
    (root / "pack.toml").write_text('name = "acme/empty"\nversion = "0.1.0"\n[splits.train]\n')
    code, out = cli("pack", "check", str(root))
    assert code == 1, out
    assert "[generators.<name>] or [source] python in pack.toml" in out, out


# -- bad input: one message per problem, exit 1 ----------------------------------------------------
def test_missing_file_listed_in_lock(tmp_path: Path) -> None:
    root = init(tmp_path)
    cli("pack", "build", str(root), "--out", str(tmp_path / "a.tar.gz"))
    (root / "tasks" / "reverse-meadow" / "instruction.md").unlink()
    code, out = cli("pack", "check", str(root))
    assert code == 1
    assert "tasks/reverse-meadow/instruction.md is locked but missing from the pack" in out


def test_wrong_lock(tmp_path: Path) -> None:
    root = init(tmp_path)
    cli("pack", "build", str(root), "--out", str(tmp_path / "a.tar.gz"))
    (root / "tasks" / "reverse-lantern" / "instruction.md").write_text("changed\n")
    (root / "tasks" / "reverse-quartz" / "task.toml").write_text(
        (root / "tasks" / "reverse-quartz" / "task.toml").read_text() + "\n"
    )
    code, out = cli("pack", "check", str(root))
    assert code == 1
    assert "tasks/reverse-lantern/instruction.md differs from its locked sha256" in out
    assert "tasks/reverse-quartz/task.toml differs from its locked sha256" in out
    assert "2 problem(s)" in out


def test_unknown_family(tmp_path: Path) -> None:
    root = init(tmp_path, form="jsonl")
    text = (root / "tasks.jsonl").read_text().replace('"family": "echo"', '"family": "chess"', 1)
    (root / "tasks.jsonl").write_text(text)
    (root / "pack.toml").write_text(
        (root / "pack.toml").read_text().replace('["echo"]', '["echo", "chess"]')
    )
    code, out = cli("pack", "check", str(root))
    assert code == 1 and "unknown family 'chess'" in out


def test_duplicate_task_id(tmp_path: Path) -> None:
    root = init(tmp_path, form="jsonl")
    lines = (root / "tasks.jsonl").read_text().splitlines()
    (root / "tasks.jsonl").write_text("\n".join([*lines, lines[0]]) + "\n")
    code, out = cli("pack", "check", str(root))
    assert code == 1 and "duplicate task id 'reverse-lantern'" in out


def test_failing_oracle(tmp_path: Path) -> None:
    root = init(tmp_path, "coding")
    solution = root / "tasks" / "add-numbers" / "solution" / "solution.py"
    solution.write_text(solution.read_text().replace("a + b", "a - b"))
    code, out = cli("pack", "check", str(root))
    assert code == 1
    assert (
        "add-numbers" in out and "the oracle scored 0.000 < the expected 1.000" in out
    )  # all or nothing


def test_every_problem_is_listed(tmp_path: Path) -> None:
    root = init(tmp_path, form="jsonl")
    lines = (root / "tasks.jsonl").read_text().splitlines()
    wrong = json.loads(lines[1])
    wrong["private"]["answer"] = "not-the-answer-but-the-oracle-submits-it"
    wrong["expected_reward"] = 1.0
    cheat = json.loads(lines[2])
    cheat["private"]["answer"] = "quartz"  # the copied word is the answer: a cheat scores 1
    dup = json.loads(lines[0])
    (root / "tasks.jsonl").write_text(
        "\n".join([lines[0], json.dumps(wrong), json.dumps(cheat), json.dumps(dup)]) + "\n"
    )
    report = asyncio.run(check_pack(root))
    checks = sorted((p.where, p.check) for p in report.problems)
    assert ("reverse-quartz", "cheat:copy-quoted") in checks
    assert any(c == "load" and "duplicate task id" in p.message
               for p, c in ((p, p.check) for p in report.problems))  # fmt: skip
    assert not report.ok and report.checked == 3


# -- verifiers that crash or hang ------------------------------------------------------------------
class CrashFamily(EchoFamily):
    name = "crashy"

    async def verify(self, ctx: EpisodeContext) -> Assessment:
        raise RuntimeError("boom")


class HangFamily(EchoFamily):
    name = "hangy"

    async def verify(self, ctx: EpisodeContext) -> Assessment:
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")


class StubbornHangFamily(EchoFamily):
    """Swallows the first cancellation, as a careless verifier might."""

    name = "stubborn"

    async def verify(self, ctx: EpisodeContext) -> Assessment:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            await asyncio.sleep(3600)
        raise AssertionError("unreachable")


def family_pack(tmp_path: Path, family: str) -> Path:
    root = tmp_path / family
    root.mkdir()
    (root / "pack.toml").write_text(
        f'name = "acme/{family}"\nversion = "0.1.0"\nfamilies = ["{family}"]\n[splits.train]\n'
    )
    (root / "tasks.jsonl").write_text(
        json.dumps(
            {
                "id": "t1",
                "family": family,
                "split": "train",
                "public": {"instruction": "say 'x' reversed"},
                "private": {"answer": "y"},
            }
        )
        + "\n"
    )
    return root


def test_verifier_that_crashes(tmp_path: Path) -> None:
    report = asyncio.run(
        check_pack(family_pack(tmp_path, "crashy"), extra_families=[CrashFamily()])
    )
    assert not report.ok
    messages = [p.message for p in report.problems]
    # oracle, null and the three cheats each crash (the rerun needs a first oracle verdict).
    assert len(messages) == 5, messages
    assert all("the verifier crashed" in m and "RuntimeError" in m for m in messages)
    assert {p.check for p in report.problems} == {
        "oracle",
        "null",
        "cheat:submit-instruction",
        "cheat:empty-answer",
        "cheat:copy-quoted",
    }


@pytest.mark.parametrize("family", [HangFamily(), StubbornHangFamily()])
def test_verifier_that_hangs(tmp_path: Path, family: EchoFamily) -> None:
    started = time.monotonic()
    report: CheckReport = asyncio.run(
        check_pack(family_pack(tmp_path, family.name), extra_families=[family], timeout_s=0.5)
    )
    assert time.monotonic() - started < 60
    assert not report.ok
    assert report.problems[0].check == "oracle"
    assert all("did not finish within 0.5 s" in p.message for p in report.problems)
    assert len(report.problems) == 5  # oracle, null, three cheats
