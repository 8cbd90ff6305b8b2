"""Harbor both ways (docs/importing.md): `pack import harbor` reads every task.toml field
(typed, clamped to the ceilings, the rest kept), dataset.toml digests pin the folders,
`pack export harbor` writes folders the `harbor` package's own loader, linter and dataset
manifest accept, import(export(pack)) keeps every task's fields, hostile exports are
refused; and the documented import → check → build → install → eval run → export works."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from palaestra.cli.main import app
from palaestra.cli.pack_import import ceilings
from palaestra.envs.terminal.family import TerminalFamily
from palaestra.envs.terminal.fields import TerminalPrivate, TerminalPublic
from palaestra.envs.terminal.harbor.config import Ceilings
from palaestra.envs.terminal.harbor.digest import content_digest
from palaestra.envs.terminal.harbor.writer import ExportError, export_tasks
from palaestra.envs.terminal.importer import import_tasks
from palaestra.sandbox.bwrap import bwrap_available
from palaestra.sdk.models import Limits
from palaestra.sdk.task import Task
from palaestra.server.families import FamilyRegistry
from palaestra.server.packs.loader import Pack, inspect_pack

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "tests" / "fixtures" / "harbor"
COOKBOOK = ROOT / "tests" / "fixtures" / "harbor-cookbook"  # real tasks, current format
SCHEMA14 = FIXTURES / "schema-1.4"  # network policy, artifacts, separate verifier, trajectory
CORE = ROOT / "packs" / "terminal-core"
runner = CliRunner()


def _load(root: Path) -> Pack:
    pack, problems = inspect_pack(root, FamilyRegistry.discover().all())
    assert pack is not None and problems == [], problems
    return pack


def _fields(task: Task) -> tuple[object, ...]:
    return (task.family, task.domain, task.split, task.difficulty,
            TerminalPublic.of(task), TerminalPrivate.of(task))  # fmt: skip


def _cli(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args), catch_exceptions=False)
    return result.exit_code, result.output


def _sum_column(src: Path, toml: str) -> Path:
    shutil.copytree(FIXTURES / "sum-column", src / "sum-column")
    (src / "sum-column" / "task.toml").write_text(toml)
    return src / "sum-column"


IMAGE = "python@sha256:" + "0a4d0b2c7c0f2b1e" * 4
FULL_TOML = f"""schema_version = "1.4"
artifacts = ["/app/out"]

[task]
name = "acme/sum-column"
keywords = ["csv"]

[metadata]
difficulty = "expert"
category = "Data Processing"
tags = ["awk"]
author_name = "palaestra tests"

[agent]
timeout_sec = 300.0
user = "agent"

[verifier]
timeout_sec = 60.0
env = {{ MODE = "strict" }}

[environment]
build_timeout_sec = 900.0
cpus = 8
memory = "3G"
storage_mb = 10240
docker_image = "{IMAGE}"
network_mode = "allowlist"
allowed_hosts = ["pypi.org"]
healthcheck = {{ command = "true" }}
"""


def test_every_task_toml_field_is_read_clamped_or_kept(tmp_path: Path) -> None:
    _sum_column(tmp_path / "src", FULL_TOML)
    ceilings = Ceilings(memory_mb=2048, cpus=2.0, workspace_mb=4096, task_timeout_s=600.0,
                        wall_s=3600.0)  # fmt: skip
    report = import_tasks("harbor", tmp_path / "src", tmp_path / "out", ceilings=ceilings)
    assert list(report.imported) == ["sum-column"], report.skipped
    notes = " ".join(report.imported["sum-column"])
    for clamp in ("cpus = 8 clamped", "memory_mb = 3072 clamped", "storage_mb = 10240 clamped",
                  "build_timeout_sec = 900 clamped"):  # fmt: skip
        assert clamp in notes, notes
    task = _load(tmp_path / "out").tasks["sum-column"]
    public, private = TerminalPublic.of(task), TerminalPrivate.of(task)
    assert (public.agent_timeout_s, public.timeout_s, private.verifier_timeout_s) == (300, 300, 60)
    resources = (public.setup_timeout_s, public.cpus, public.memory_mb, public.workspace_mb)
    assert resources == (600, 2.0, 2048, 4096)
    assert task.difficulty == "medium" and task.domain == "src/data-processing"
    kept = private.harbor
    assert kept["environment"] == {
        "docker_image": IMAGE,
        "network_mode": "allowlist",
        "allowed_hosts": ["pypi.org"],
        "healthcheck": {"command": "true"},
    }
    assert kept["task"] == {"name": "acme/sum-column", "keywords": ["csv"]}
    assert kept["metadata"]["difficulty"] == "expert" and kept["metadata"]["tags"] == ["awk"]
    assert kept["agent"] == {"user": "agent"} and kept["verifier"] == {"env": {"MODE": "strict"}}
    assert kept["artifacts"] == ["/app/out"] and "schema_version" not in kept  # the writer's
    assert public.allow_internet and public.allowed_hosts == ["pypi.org"]
    # The agent's timeout is the episode's wall time unless the client asks for its own.
    family = TerminalFamily()
    assert family.episode_limits(task, {}, Limits()).max_wall_s == 300
    assert family.episode_limits(task, {"max_wall_s": 50}, Limits(max_wall_s=50)).max_wall_s == 50
    spec = family.sandbox_spec(task)
    assert spec is not None and (spec.cpus, spec.memory_mb, spec.workspace_mb) == (2.0, 2048, 4096)


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        ("[environment]\ngpus = 2\n", "2 GPU(s)"),
        ('[environment]\nos = "windows"\n', "runs Linux"),
        ('[[steps]]\nname = "one"\n', "multi-step"),
        ('[agent]\ntimeout_sec = "soon"\n', "[agent] timeout_sec = 'soon' must be a positive"),
        ('[environment]\nworkdir = "/srv"\n', "differs from the Dockerfile's WORKDIR"),
        ('[environment]\nmemory = "lots"\n', "is not a size like '2G'"),
        ("[verifier]\ntimeout_sec = inf\n", "must be a positive number"),
    ],
)
def test_what_a_sandbox_cannot_give_is_named(tmp_path: Path, extra: str, reason: str) -> None:
    _sum_column(tmp_path / "src", f'version = "1.0"\n{extra}')
    shutil.copytree(FIXTURES / "sum-column", tmp_path / "src" / "fine")
    report = import_tasks("harbor", tmp_path / "src", tmp_path / "out")
    assert list(report.imported) == ["fine"]  # the rest of the set imports
    assert reason in " ".join(report.skipped["sum-column"]), report.skipped


def test_real_harbor_tasks_in_the_current_format(tmp_path: Path) -> None:
    out = tmp_path / "out"  # clamped to this machine's ceilings, as `pack import` does
    report = import_tasks("harbor", COOKBOOK, out, name="harbor/cookbook", ceilings=ceilings())
    # multi-reward's named rewards (reward.json) are read by the verifier's runner.
    assert sorted(report.imported) == ["multi-reward", "simple-task"]
    assert "multi-step" in " ".join(report.skipped["multi-step"])
    task = _load(tmp_path / "out").tasks["simple-task"]
    public, private = TerminalPublic.of(task), TerminalPrivate.of(task)
    assert (public.agent_timeout_s, private.verifier_timeout_s, public.setup_timeout_s) == (
        120,
        120,
        600,
    )
    assert (public.cpus, public.memory_mb, public.workspace_mb) == (1, 2048, 8192)
    assert private.harbor == {} and private.reward_file  # `version = "1.0"`: the writer's


def test_a_harbor_folder_named_files_is_copied_as_any_other(tmp_path: Path) -> None:
    """Only an export's environment/files/ is read as a file map; a task's own is COPYed."""
    task = _sum_column(tmp_path / "src", (FIXTURES / "sum-column" / "task.toml").read_text())
    (task / "environment" / "files").mkdir()
    (task / "environment" / "files" / "a.txt").write_text("A\n")
    dockerfile = task / "environment" / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text() + "COPY files/ /app/data/\n")
    import_tasks("harbor", tmp_path / "src", tmp_path / "out")
    environment = TerminalPublic.of(_load(tmp_path / "out").tasks["sum-column"]).environment
    assert environment["data/a.txt"] == "A\n" and "orders.csv" in environment


def test_round_trip_keeps_every_task_field(tmp_path: Path) -> None:
    """terminal-core (directory form) → Harbor → palaestra: the same typed fields, splits
    included; a Harbor import → export → import: the very same task dicts."""
    code, output = _cli("pack", "export", "harbor", str(CORE), str(tmp_path / "h"))
    assert code == 0, output
    core = _load(CORE)
    repo_tasks = sorted(t.id for t in core.tasks.values() if "test.sh" not in
                        TerminalPrivate.of(t).verifier)  # fmt: skip
    for tid in repo_tasks:  # pytest-set tasks: named, with the reason
        assert re.search(rf"skipped {tid}: not exported: its tests are pytest sets", output)
    assert f"{len(core.tasks) - len(repo_tasks)} exported, {len(repo_tasks)} skipped" in output
    code, output = _cli("pack", "import", "harbor", str(tmp_path / "h"), str(tmp_path / "back"),
                        "--name", core.name)  # fmt: skip
    assert code == 0, output
    back = _load(tmp_path / "back")
    assert set(back.tasks) == set(core.tasks) - set(repo_tasks)
    assert {tid: _fields(t) for tid, t in back.tasks.items()} == {
        tid: _fields(core.tasks[tid]) for tid in back.tasks
    }
    assert back.sealed == {"heldout": True, "train": False}

    hb = tmp_path / "hb"
    assert import_tasks("harbor", FIXTURES, hb, name="imported/harbor").imported
    export_tasks(list(_load(hb).tasks.values()), tmp_path / "hx", pack="imported/harbor",
                 version="0.1.0")  # fmt: skip
    import_tasks("harbor", tmp_path / "hx", tmp_path / "hb2", name="imported/harbor")
    first, again = _load(hb).tasks, _load(tmp_path / "hb2").tasks
    assert {k: (t.public, t.private) for k, t in again.items()} == {
        k: (t.public, t.private) for k, t in first.items()
    }


def test_dataset_digests_pin_the_folders(tmp_path: Path) -> None:
    export_tasks(list(_load(CORE).tasks.values())[:6], tmp_path / "h", pack="p/core", version="1")
    dataset = tomllib.loads((tmp_path / "h" / "dataset.toml").read_text())
    pins = {t["name"]: t["digest"] for t in dataset["tasks"]}
    assert pins and all(d == content_digest(tmp_path / "h" / n.split("/")[1])
                        for n, d in pins.items())  # fmt: skip
    victim = sorted(pins)[0].split("/")[1]
    (tmp_path / "h" / victim / "tests" / "palaestra" / "test.sh").write_text("exit 0\n")
    report = import_tasks("harbor", tmp_path / "h", tmp_path / "back")
    assert "does not match dataset.toml's pin" in " ".join(report.skipped[victim])
    assert len(report.imported) == len(pins) - 1
    assert all("matches dataset.toml" in " ".join(n) for n in report.imported.values())


def _terminal_task(tid: str, **fields: object) -> Task:
    public = {"instruction": "do it", "workdir": "/work", **fields.pop("public", {})}  # type: ignore[dict-item]
    private = {"verifier": {"test.sh": "exit 1\n"}, "solution": {"solve.sh": "true\n"}}
    private.update(fields.pop("private", {}))  # type: ignore[arg-type]
    return Task(id=tid, family="terminal", domain="p/misc", split="train", pack="p/p",
                version="1", public=public, private=private, difficulty="easy")  # fmt: skip


def test_export_refuses_what_would_write_outside_or_over(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    code, output = _cli("pack", "export", "harbor", str(CORE), str(out))
    assert code == 2 and "exists" in output and (out / "keep.txt").read_text() == "mine"
    with pytest.raises(ExportError, match="--force"):
        export_tasks([_terminal_task("ok")], out, pack="p/p", version="1")
    hostile = [
        _terminal_task("../evil"),
        _terminal_task("verifier-escape", private={"verifier": {"test.sh": "", "../../x": "!"}}),
        _terminal_task("env-escape", public={"environment": {"/etc/cron.d/x": "!"}}),
        _terminal_task("solution-escape", private={"solution": {"a/../../../y": "!"}}),
        _terminal_task("env-newline", public={"env": {"A": "1\nRUN curl evil"}}),
        _terminal_task("ok", public={"env": {"HOMEISH": "$HOME/x"}}),
    ]
    report = export_tasks(hostile, out, pack="p/p", version="1", force=True)
    assert list(report.exported) == ["ok"]
    assert set(report.skipped) == {t.id for t in hostile} - {"ok"}
    assert "not a plain folder name" in report.skipped["../evil"][0]
    assert "cannot be written as a Dockerfile ENV line" in report.skipped["env-newline"][0]
    written = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()}
    assert all(p.startswith("out/ok/") or p == "out/dataset.toml" for p in written), written
    assert 'ENV HOMEISH="\\$HOME/x"' in (out / "ok" / "environment" / "Dockerfile").read_text()


def test_import_prints_a_summary_and_the_table_only_with_verbose(tmp_path: Path) -> None:
    code, output = _cli("pack", "import", "harbor", str(FIXTURES), str(tmp_path / "a"))
    assert code == 0 and "1 imported, 2 skipped (" in output
    assert "GPU/TPU" in output and "needs the network" in output and "node-api" not in output
    code, output = _cli("pack", "import", "harbor", str(FIXTURES), str(tmp_path / "b"), "-v")
    assert code == 0 and "node-api" in output and "train-gpu" in output


def _harbor_python() -> Path:
    """The harbor package's venv (scripts/harbor-venv.sh, made on first use); skips only
    where it cannot be installed at all: no Python >= 3.12 (exit 3), or PyPI out of reach."""
    made = subprocess.run(["bash", str(ROOT / "scripts" / "harbor-venv.sh")],
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    offline = re.search(r"(?i)connection|resolve|network|temporary failure", made.stderr)
    if made.returncode == 3 or (made.returncode != 0 and offline):
        pytest.skip(f"the harbor package cannot be installed here: {made.stderr[-300:]}")
    assert made.returncode == 0, f"scripts/harbor-venv.sh failed:\n{made.stderr[-2000:]}"
    return Path(made.stdout.strip().splitlines()[-1])


def _harbor_check(python: Path, folder: Path) -> dict[str, Any]:
    checked = subprocess.run([str(python), str(ROOT / "scripts" / "harbor_check.py"), str(folder)],
                             capture_output=True, text=True, timeout=300)  # fmt: skip
    assert checked.returncode == 0, checked.stderr[-2000:]
    seen: dict[str, Any] = json.loads(checked.stdout)
    return seen


@pytest.mark.slow
def test_export_is_accepted_by_harbors_own_tooling(tmp_path: Path) -> None:
    python = _harbor_python()
    # The schema 1.4 fixtures are Harbor's own 1.4 as its newest reader takes it.
    source = _harbor_check(python, SCHEMA14)["tasks"]
    assert all(row["loaded"] and row["lint"] == [] for row in source.values()), source
    assert {row["schema_version"] for row in source.values()} == {"1.4"}
    out = tmp_path / "h"
    hb = tmp_path / "hb"
    import_tasks("harbor", FIXTURES, hb, name="imported/harbor")
    import_tasks("harbor", COOKBOOK, tmp_path / "cb", name="harbor/cookbook", ceilings=ceilings())
    import_tasks("harbor", SCHEMA14, tmp_path / "v14", name="harbor/v14")
    tasks = [*_load(CORE).tasks.values(), *_load(hb).tasks.values()]
    tasks += [*_load(tmp_path / "cb").tasks.values(), *_load(tmp_path / "v14").tasks.values()]
    report = export_tasks(tasks, out, pack="palaestra/mixed", version="1.0.0")
    seen = _harbor_check(python, out)
    assert set(seen["tasks"]) == set(report.exported)
    for tid, row in seen["tasks"].items():
        assert row["loaded"] and row["lint"] == [], (tid, row)
        assert row["digest"] == seen["dataset"]["tasks"][tid] == report.exported[tid], tid
    harbor_row = seen["tasks"]["sum-column"]  # Harbor reads back what the import read
    assert (harbor_row["agent_timeout_sec"], harbor_row["verifier_timeout_sec"]) == (300, 60)
    assert (harbor_row["cpus"], harbor_row["memory_mb"]) == (1, 2048)
    assert harbor_row["metadata"]["tags"] == ["awk", "csv"]
    assert harbor_row["network_mode"] == "no-network"
    assert seen["tasks"]["simple-task"]["agent_timeout_sec"] == 120
    assert {row["schema_version"] for row in seen["tasks"].values()} == {"1.4"}
    net = seen["tasks"]["allowlist-net"]  # the agent phase's allow-list, as imported
    assert (net["agent_network_mode"], net["agent_allowed_hosts"]) == (
        "allowlist",
        ["pypi.org", "*.pythonhosted.org"],
    )
    separate = seen["tasks"]["separate-verifier"]  # its image, with the exported tests in it
    assert (separate["verifier_mode"], separate["verifier_bundled_tests"]) == ("separate", True)
    assert separate["artifacts"] == ["/app", "/app/total.txt", "report"]
    core_row = seen["tasks"][sorted(report.exported)[0]]
    assert core_row["instruction"].strip() and core_row["memory_mb"] == 1024


def _doc_commands() -> list[list[str]]:
    text = (ROOT / "docs" / "importing.md").read_text()
    block = text.split("<!-- e2e:begin -->", 1)[1].split("<!-- e2e:end -->", 1)[0]
    lines = [ln for ln in block.splitlines() if ln.startswith("palaestra ")]
    return [shlex.split(ln)[1:] for ln in lines]


@pytest.mark.timeout(300)
@pytest.mark.skipif(not bwrap_available()[0], reason=f"bwrap unavailable: {bwrap_available()[1]}")
def test_importing_doc_end_to_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every command of docs/importing.md's end-to-end block, in order, from a fresh folder
    (the fixture path as the repository has it): oracle 1, null 0, cheats ≤ 0.1, an eval run
    of reward 1, and the export."""
    monkeypatch.chdir(tmp_path)
    commands = _doc_commands()
    assert [c[:2] for c in commands] == [["pack", "import"], ["pack", "check"],
        ["pack", "build"], ["pack", "install"], ["eval", "run"], ["pack", "export"]]  # fmt: skip
    for args in commands:
        args = [str(FIXTURES) if a == "tests/fixtures/harbor" else a for a in args]
        result = runner.invoke(app, args, catch_exceptions=False)
        assert result.exit_code == 0, (args, result.output)
        if args[:2] == ["pack", "check"]:
            assert "oracle 1/1 pass, null 1/1 zero, cheats 1/1 ≤ 0.1, void 0" in result.output
    check = json.loads((tmp_path / "imported-harbor-check.json").read_text())
    assert check["summary"]["line"] == "oracle 1/1 pass, null 1/1 zero, cheats 1/1 ≤ 0.1, void 0"
    [row] = check["results"]
    assert row["task"] == "sum-column" and row["verdict"] == "pass" and row["void"] == {}
    assert row["oracle"] == 1.0 and row["null"] == 0.0 and max(row["cheats"].values()) <= 0.1
    [report] = (tmp_path / "runs").glob("*/report.json")
    summary = json.loads(report.read_text())["summary"]
    assert summary["attempts"] == 1 and summary["mean_reward"] == 1.0, summary
    assert (tmp_path / "harbor-out" / "sum-column" / "tests" / "test.sh").is_file()
