"""Task environment images (envs/terminal/envimage.py), without an engine: the context's
digest names the image, FROM lines go through the alias map, a context that reaches outside
itself (``..``, absolute sources, a URL, a symlink) or is too big is refused with its cause,
and the importer keeps the build context of real tasks whose Dockerfile installs packages
(tests/fixtures/tb-adapters) while still naming what it cannot take."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from palaestra.cli.unbuilt import cause_line
from palaestra.envs.terminal.envimage import (
    build_cause,
    collect_context,
    context_problems,
    image_name,
    rewrite_from,
)
from palaestra.envs.terminal.harbor.config import Ceilings
from palaestra.envs.terminal.importer import import_tasks
from palaestra.sandbox.bwrap import bwrap_available
from palaestra.server.config import Settings

FIXTURES = Path(__file__).parents[2] / "fixtures"
PYPI = Ceilings(4096, 4.0, 2048, 600.0, 3600.0, egress_allow=("pypi.org", "files.pythonhosted.org"))


def test_digest_names_the_image() -> None:
    a = {"Dockerfile": "FROM x\n", "f.txt": "1\n"}
    assert image_name(a) == image_name(dict(reversed(list(a.items()))))
    assert image_name(a) != image_name({**a, "f.txt": "2\n"})
    assert image_name(a).startswith("env-") and len(image_name(a)) == 24


def test_aliases_rewrite_from() -> None:
    aliases = Settings().image_aliases
    text = (
        "FROM --platform=linux/amd64 ghcr.io/laude-institute/t-bench/python-3-13:20250620 AS b\n"
        "RUN echo hi\nFROM b\nFROM ubuntu:24.04\nFROM ziglang/zig:0.11\n"
    )
    out, mapped = rewrite_from(text, aliases)
    lines = out.splitlines()
    assert lines[0] == "FROM palaestra/python3.13:latest AS b"  # any tag; --platform dropped
    assert lines[2] == "FROM b"  # an earlier stage is not an image
    assert lines[3] == "FROM palaestra/ubuntu:latest"
    assert lines[4] == "FROM ziglang/zig:0.11"  # no alias (the import refuses it first)
    assert len(mapped) == 2
    assert rewrite_from("FROM python:3.13-slim\n", {"python:3.13-slim": "me/py"})[0] == (
        "FROM me/py\n"
    )


def test_hostile_contexts_are_refused_with_their_cause() -> None:
    def why(dockerfile: str, **extra: str) -> str:
        return " | ".join(context_problems({"Dockerfile": dockerfile, **extra}, 1 << 20))

    assert "inside the build context" in why("FROM x\nCOPY ../secret /app/\n")
    assert "inside the build context" in why("FROM x\nCOPY /etc/passwd /app/\n")
    assert "download at build time" in why("FROM x\nADD https://example.com/a.tgz /app/\n")
    assert why("FROM x\nCOPY --from=b /out /app/\nCOPY a.txt /app/\n", **{"a.txt": "1"}) == ""
    assert "over the limit" in " ".join(
        context_problems({"Dockerfile": "FROM x\n", "big": "x" * (2 << 20)}, 1 << 20)
    )
    assert "no Dockerfile" in " ".join(context_problems({"a": "1"}, 1 << 20))
    assert "plain relative path" in " ".join(
        context_problems({"Dockerfile": "FROM x\n", "../a": "1"}, 1 << 20)
    )


def test_collect_context_never_follows_links(tmp_path: Path) -> None:
    (tmp_path / "Dockerfile").write_text("FROM x\n")
    (tmp_path / "data.txt").write_text("ok\n")
    os.symlink("/etc/passwd", tmp_path / "passwd")
    os.symlink("/", tmp_path / "root")  # a walk through it would read the whole host
    (tmp_path / "blob.bin").write_bytes(b"\xff\xfe\x00")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD").write_text("ref\n")
    files, problems, notes = collect_context(tmp_path, set())
    assert files == {"Dockerfile": "FROM x\n", "data.txt": "ok\n"}
    text = " | ".join(problems)
    assert "passwd is a symlink" in text and "root is a symlink" in text
    assert "blob.bin is a binary file" in text
    assert ".git/HEAD" in " ".join(notes)


def test_build_cause_keeps_the_failing_step() -> None:
    log = (
        "Sending build context to Docker daemon  2kB\nStep 1/3 : FROM palaestra/base:bookworm\n"
        " ---> 5e4ef79272a5\nStep 2/3 : RUN pip install nosuchpkg\n ---> Running in 1\n"
        "ERROR: No matching distribution found for nosuchpkg\n"
        "The command '/bin/sh -c pip install nosuchpkg' returned a non-zero code: 1\n"
    )
    cause = build_cause(log)
    assert cause.startswith("Step 2/3 : RUN pip install nosuchpkg")
    assert "No matching distribution" in cause and "--->" not in cause


def test_real_tasks_keep_their_build_context(tmp_path: Path) -> None:
    out = tmp_path / "tba"
    report = import_tasks("terminal-bench", FIXTURES / "tb-adapters", out, ceilings=PYPI)
    imported, skipped = report.imported, report.skipped
    # a plain task converts as before (no build context)
    assert "evoeval-10" in imported and not (out / "tasks" / "evoeval-10" / "build").exists()
    # a test script's pytest install (`pip3 install pytest || pip install pytest`) on a task
    # that runs in an image of its own (which has no pytest) is the verifier's, through the
    # proxy (envs/terminal/installs.py); without the registries allowed it is refused
    aider = "aider_polyglot-polyglot_python_robot-name"
    assert "installs (pytest) run before them" in " ".join(imported[aider])
    meta = tomllib.loads((out / "tasks" / aider / "task.toml").read_text())
    assert meta["private"]["verifier_installs"] == ["pytest"]
    closed = import_tasks("terminal-bench", FIXTURES / "tb-adapters", tmp_path / "closed")
    assert "egress_allow" in " ".join(closed.skipped[aider])
    # what no image fixes is still named: the tests need the network (an external judge)
    assert "over the network" in " ".join(skipped["livecodebenchpro-lcbpro-1988c"])
    on_disk = json.loads((out / "import-report.json").read_text())
    assert {i["id"] for i in on_disk["imported"]} == set(imported)
    # a Harbor task whose Dockerfile the terminal image cannot stand in for: built, not refused
    harbor = import_tasks("harbor", FIXTURES / "terminal-bench-2", tmp_path / "tb2")
    assert "image built from its Dockerfile" in " ".join(harbor.imported["skills"])
    task = tmp_path / "tb2" / "tasks" / "skills"
    assert (task / "build" / "Dockerfile").is_file() and (task / "build" / "skills").is_dir()
    assert not (task / "environment").exists()  # the image holds the workdir


@pytest.mark.skipif(not bwrap_available()[0], reason=f"bwrap unavailable: {bwrap_available()[1]}")
def test_the_oracles_payload_goes_with_the_solution_not_the_workspace(tmp_path: Path) -> None:
    """aider_polyglot keeps its reference solution in the workspace (`.oracle/solution.enc`,
    whose password is in solution.sh): the agent's image must not hold it, nor solution.sh;
    the solve script carries it and still applies it (real openssl, in a bwrap sandbox
    whose /app is the task's workspace)."""
    task = "aider_polyglot-polyglot_python_robot-name"
    source = FIXTURES / "tb-adapters" / task
    report = import_tasks(
        "terminal-bench", FIXTURES / "tb-adapters", tmp_path / "pack", ceilings=PYPI
    )
    assert any("oracle's payload" in n for n in report.imported[task])
    out = tmp_path / "pack" / "tasks" / task
    held = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert not [p for p in held if ".oracle" in p or p.endswith("solution.sh")]
    app = tmp_path / "app"
    shutil.copytree(source / "workspace", app, ignore=shutil.ignore_patterns(".oracle"))
    stub = (app / "robot_name.py").read_text()
    run = subprocess.run(
        ["bwrap", "--dev-bind", "/", "/", "--bind", str(app), "/app", "--unshare-net",
         "bash", str(out / "solution" / "solve.sh")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    solved = (app / "robot_name.py").read_text()
    assert solved != stub and "class Robot" in solved


def test_a_build_cause_gives_its_line_and_step() -> None:
    cause = (
        "Step 5/6 : RUN apt-get install -y openjdk-21-jdk\n ---> Running in 3f2a\n"
        "Reading package lists...\nE: Unable to locate package openjdk-21-jdk\n"
        "The command '/bin/sh -c apt-get install -y openjdk-21-jdk' returned a non-zero code: 100"
    )
    assert cause_line(cause) == (
        "E: Unable to locate package openjdk-21-jdk (at RUN apt-get install -y openjdk-21-jdk)"
    )
    assert cause_line("") == "no build log"
