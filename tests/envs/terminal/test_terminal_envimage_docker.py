"""Task environment images on a real engine: a context builds from empty and is cached the
second time; a build that fails or never ends is reported with its cause; a Dockerfile's
`USER root`, ENTRYPOINT and CMD change nothing of the sandbox (uid, capabilities, network);
a real Harbor task (tests/fixtures/terminal-bench-2/skills, whose Dockerfile copies files
outside the workdir) imports, builds and runs in its own image with null 0, and real
Terminal-Bench tasks pass their oracle on docker. Skips when the engine or the base is
missing (scripts/docker-up.sh)."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from palaestra.cli.main import app
from palaestra.envs.terminal.envimage import (
    build_env_image,
    docker_tag,
    export_rootfs,
    image_name,
)
from palaestra.sandbox import SandboxCreateError, SandboxSpec
from palaestra.sandbox.bwrap import BwrapBackend, bwrap_available
from palaestra.sandbox.docker import DockerBackend
from palaestra.server.packcheck import CheckReport, check_pack
from tests.conftest import docker_skip_reason

FIXTURES = Path(__file__).parents[2] / "fixtures"
BASE = "palaestra/base:bookworm"
WHY = docker_skip_reason(BASE)
pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(WHY), reason=WHY)]
BUILD = {"aliases": {}, "timeout_s": 120.0, "max_bytes": 1 << 20, "workdir": "/app"}

HOSTILE = {
    "Dockerfile": (
        f"FROM {BASE}\n"
        "COPY entry.sh /entry.sh\n"
        "RUN mkdir -p /app && echo data > /app/seed.txt && chmod 0600 /app/seed.txt\n"
        "USER root\n"
        'ENTRYPOINT ["/bin/sh", "/entry.sh"]\n'
        'CMD ["/bin/sh", "-c", "touch /marker-cmd"]\n'
    ),
    "entry.sh": '#!/bin/sh\ntouch /tmp/entrypoint-ran\nexec "$@"\n',
}


def _run(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=False).stdout


def test_build_then_cached_and_failures_with_causes() -> None:
    first = build_env_image(HOSTILE, **BUILD)  # type: ignore[arg-type]
    assert first.status in ("built", "cached"), first.cause
    assert build_env_image(HOSTILE, **BUILD).status == "cached"  # type: ignore[arg-type]
    broken = {"Dockerfile": f"FROM {BASE}\nRUN echo about to fail && exit 7\n"}
    bad = build_env_image(broken, **BUILD)  # type: ignore[arg-type]
    assert bad.status == "failed" and "RUN echo about to fail" in bad.cause
    assert "non-zero code: 7" in bad.cause
    assert _run(["docker", "image", "ls", "-q", docker_tag(image_name(broken))]) == ""
    never = {"Dockerfile": f"FROM {BASE}\nRUN echo start && sleep 600\n"}
    slow = build_env_image(never, **{**BUILD, "timeout_s": 4.0})  # type: ignore[arg-type]
    assert slow.status == "failed" and "timeout of 4 s" in slow.cause
    # a base no registry here has, through the operator's alias map
    foreign = {"Dockerfile": "FROM registry.example/team/py:3.13 AS b\nRUN true\nFROM b\n"}
    unaliased = {"Dockerfile": foreign["Dockerfile"] + "# no alias\n"}
    missing = build_env_image(unaliased, **BUILD)  # type: ignore[arg-type]
    assert missing.status == "failed" and "registry.example" in missing.cause, missing.cause
    aliased = build_env_image(  # type: ignore[misc]
        foreign, **{**BUILD, "aliases": {"registry.example/team/py": BASE}}
    )
    assert aliased.status in ("built", "cached"), aliased.cause
    escape = {"Dockerfile": f"FROM {BASE}\nCOPY ../../etc/passwd /app/\n"}
    refused = build_env_image(escape, **BUILD)  # type: ignore[arg-type]
    assert refused.status == "failed" and "inside the build context" in refused.cause


async def test_image_cannot_change_the_sandbox() -> None:
    assert build_env_image(HOSTILE, **BUILD).status in ("built", "cached")  # type: ignore[arg-type]
    backend = DockerBackend()
    spec = SandboxSpec(image=image_name(HOSTILE), workdir="/app", default_timeout_s=10.0)
    try:
        async with await backend.create(spec) as box:
            r = await box.exec(
                "id -u; grep CapEff /proc/self/status; ls /tmp/entrypoint-ran /marker-cmd 2>&1;"
                " cat /proc/net/dev | grep -c eth0; ls /.palaestra-env/workdir"
            )
            out = r.stdout
            assert out.splitlines()[0] == "1000", out  # not root, whatever USER says
            assert "CapEff:\t0000000000000000" in out
            assert "No such file" in out and "entrypoint-ran\n" not in out.split("No such")[0]
            assert "\n0\n" in out  # no network interface but lo
            assert "seed.txt" in out  # the workdir snapshot, readable by the sandbox user
    finally:
        await backend.aclose()


def test_real_tasks_import_build_and_run(tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "tb2"
    result = runner.invoke(
        app, ["pack", "import", "harbor", str(FIXTURES / "terminal-bench-2"), str(out), "--build"]
    )
    assert result.exit_code == 0, result.output
    assert re.search(r"env-\w+: (built|cached) \(\d+ s\) tasks: skills\n", result.output)
    report = json.loads((out / "import-report.json").read_text())
    skipped = {i["id"]: " ".join(i["reasons"]) for i in report["skipped"]}
    assert "services (api-server, main)" in skipped["multi-container"]
    for name in ("multi-container", "multi-reward", "simple-task", "dns-blacklisting"):
        shutil.rmtree(out / "tasks" / name, ignore_errors=True)
    build_report = tmp_path / "build.json"
    built = runner.invoke(
        app, ["images", "build", "--pack", str(out), "--report", str(build_report)]
    )
    assert built.exit_code == 0, built.output
    envs = json.loads(build_report.read_text())["environments"]
    assert [(e["status"] in ("built", "cached"), e["tasks"]) for e in envs] == [(True, ["skills"])]
    tb = tmp_path / "tba"
    result = runner.invoke(
        app, ["pack", "import", "terminal-bench", str(FIXTURES / "tb-adapters"), str(tb)]
    )
    keep = {"evoeval-10"}
    for task in (tb / "tasks").iterdir():
        if task.name not in keep:
            shutil.rmtree(task)

    async def both() -> list[CheckReport]:
        packs = (out, tb)
        return list(await asyncio.gather(*(check_pack(p, sandbox="docker") for p in packs)))

    harbor, plain = asyncio.run(both())
    # the built environment serves the task: null 0 (its oracle waits on the verifier's uvx)
    assert harbor.results["skills"].null == 0.0, harbor.problems
    assert not [p for p in harbor.problems if p.check == "null"]
    assert plain.ok, [(p.where, p.check, p.message) for p in plain.problems]


@pytest.mark.skipif(not bwrap_available()[0], reason=f"bwrap unavailable: {bwrap_available()[1]}")
async def test_same_image_serves_bwrap_as_rootfs(tmp_path: Path) -> None:
    assert build_env_image(HOSTILE, **BUILD).status in ("built", "cached")  # type: ignore[arg-type]
    name = image_name(HOSTILE)
    root = export_rootfs(name, tmp_path)
    assert root == tmp_path / name / "rootfs" and (root / "usr").is_dir()
    assert export_rootfs(name, tmp_path) == root  # kept, not exported again
    backend = BwrapBackend(images_dir=tmp_path)
    try:
        spec = SandboxSpec(image=name, workdir="/app", default_timeout_s=10.0)
        async with await backend.create(spec) as box:
            r = await box.exec("id -u; ls /.palaestra-env/workdir; ls /tmp/entrypoint-ran 2>&1")
            assert r.stdout.splitlines()[:2] == ["1000", "seed.txt"], r
            assert "No such file" in r.stdout
    finally:
        await backend.aclose()


async def test_missing_environment_image_says_how_to_build_it() -> None:
    backend = DockerBackend()
    spec = SandboxSpec(image="env-0000000000000000dead", workdir="/app")
    try:
        with pytest.raises(SandboxCreateError, match="images build --pack PACK"):
            await backend.create(spec)
    finally:
        await backend.aclose()


def test_a_task_whose_environment_does_not_build_is_refused_at_import(tmp_path: Path) -> None:
    """`pack import --build`: a real apt failure (a package Debian bookworm lacks, as
    aider_polyglot's `openjdk-21-jdk` on the stand-in) refuses that task, in the report and
    its summary, with the failing line and step; the task that builds stays imported."""
    src = tmp_path / "src"
    good = FIXTURES / "terminal-bench" / "grep-errors"
    plain = "FROM python:3.11-slim\nWORKDIR /app\nCOPY logs/server.log /app/logs/server.log\n"
    for name, extra in (
        ("grep-errors", ""),  # converts without an image of its own
        ("needs-jdk21", "RUN apt-get install -y --no-install-recommends openjdk-21-jdk\n"),
    ):
        shutil.copytree(good, src / name)
        (src / name / "Dockerfile").write_text(plain + extra)
    out = tmp_path / "pack"
    result = CliRunner().invoke(
        app, ["pack", "import", "terminal-bench", str(src), str(out), "--build"]
    )
    assert result.exit_code == 0, result.output
    assert "1 imported, 1 skipped (1 × environment does not build)" in result.output
    report = json.loads((out / "import-report.json").read_text())
    assert [i["id"] for i in report["imported"]] == ["grep-errors"]
    (refused,) = report["skipped"]
    reason = " ".join(refused["reasons"])
    assert "Unable to locate package openjdk-21-jdk" in reason, reason
    assert "apt-get install -y --no-install-recommends openjdk-21-jdk" in reason, reason
    assert report["skipped_by_reason"] == {"environment does not build": 1}
    assert not (out / "tasks" / "needs-jdk21").exists()
    strict = CliRunner().invoke(
        app, ["pack", "import", "terminal-bench", str(src), str(out), "--build", "--force",
              "--strict"],
    )  # fmt: skip
    assert strict.exit_code == 1
