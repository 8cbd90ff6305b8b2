"""A hostile Harbor task set must not carry the importer's own files into a pack (where the
environment and the instruction reach the agent): symlinks out of a task folder, a
Dockerfile COPY of `../..`, a symlinked instruction or directory are refused by name, and
the rest of the set imports."""

from __future__ import annotations

import shutil
from pathlib import Path

from palaestra.envs.terminal.importer import import_tasks

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "harbor" / "sum-column"
SECRET = "TOPSECRET-7f3a"


def test_a_harbor_set_cannot_smuggle_host_files_into_the_pack(tmp_path: Path) -> None:
    secret = tmp_path / "home" / "id_rsa"
    secret.parent.mkdir()
    secret.write_text(f"{SECRET}\n")
    src = tmp_path / "src"
    for name in ("fine", "test-link", "copy-up", "instruction-link", "dir-link", "solve-link"):
        shutil.copytree(FIXTURE, src / name)
    (src / "test-link" / "tests" / "leak.py").symlink_to(secret)
    dockerfile = src / "copy-up" / "environment" / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text() + "COPY ../../../home/id_rsa /app/\n")
    (src / "instruction-link" / "instruction.md").unlink()
    (src / "instruction-link" / "instruction.md").symlink_to(secret)
    (src / "dir-link" / "environment" / "keys").symlink_to(secret.parent)
    dockerfile = src / "dir-link" / "environment" / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text() + "COPY keys /app/keys\n")
    (src / "solve-link" / "solution" / "helper.sh").symlink_to(secret)

    report = import_tasks("harbor", src, tmp_path / "out")
    assert list(report.imported) == ["fine"]
    why = {tid: " ".join(reasons) for tid, reasons in report.skipped.items()}
    assert "tests/leak.py is a symlink" in why["test-link"]
    assert "outside the task folder" in why["copy-up"]
    assert "instruction.md is a symlink" in why["instruction-link"]
    assert "outside the task folder or a symlink" in why["dir-link"]
    assert "solution/helper.sh is a symlink" in why["solve-link"]
    for path in (tmp_path / "out").rglob("*"):
        assert not path.is_file() or SECRET not in path.read_text(), path


def test_a_terminal_bench_task_with_a_problem_no_image_solves_is_refused(tmp_path: Path) -> None:
    """A Dockerfile problem an image of its own cannot fix (a COPY from outside the task)
    refuses the task with every cause, never imports it with its setup half dropped."""
    src = tmp_path / "src" / "copy-up"
    src.mkdir(parents=True)
    (src / "task.yaml").write_text("instruction: do it\n")
    (src / "Dockerfile").write_text(
        "FROM buildpack-deps:jammy\nRUN curl -L https://golang.org/x.tgz -o x.tgz\n"
        "COPY ../../secret /app/\n"
    )
    (src / "solution.sh").write_text("true\n")
    (src / "tests").mkdir()
    (src / "tests" / "test_outputs.py").write_text("def test_ok():\n    assert True\n")
    report = import_tasks("terminal-bench", tmp_path / "src", tmp_path / "out")
    assert not report.imported
    why = " ".join(report.skipped["copy-up"])
    assert "outside the task folder" in why and "needs the network" in why, why
