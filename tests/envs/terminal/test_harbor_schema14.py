"""Harbor task schema 1.4 both ways (docs/importing.md, "Harbor 1.4"): the network policy
of each phase becomes the task's `allow_internet` / `allowed_hosts` (the sandbox's egress
narrowed to them), artifacts are checked against what palaestra's verifier receives (the
workdir), a separate verifier environment's image becomes the verifier image, and a seeded
`trajectory.json` is refused; what cannot run is refused at import naming why. The export
writes schema 1.4 (Harbor's own reader: test_harbor.py's slow test)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tomllib
from pathlib import Path

import pytest

from palaestra.envs.terminal.family import TerminalFamily
from palaestra.envs.terminal.fields import TerminalPrivate, TerminalPublic
from palaestra.envs.terminal.harbor.config import Ceilings
from palaestra.envs.terminal.harbor.writer import export_tasks, task_config
from palaestra.envs.terminal.importer import import_tasks
from palaestra.envs.terminal.verifierimage import task_verifier_tag
from palaestra.sandbox.bwrap import bwrap_available
from palaestra.sandbox.egress import DEFAULT_ALLOW
from palaestra.sdk.task import Task
from palaestra.server.families import FamilyRegistry
from palaestra.server.packs.loader import Pack, inspect_pack

ROOT = Path(__file__).resolve().parents[3]
SUM_COLUMN = ROOT / "tests" / "fixtures" / "harbor" / "sum-column"
SCHEMA14 = ROOT / "tests" / "fixtures" / "harbor" / "schema-1.4"


def _load(root: Path) -> Pack:
    pack, problems = inspect_pack(root, FamilyRegistry.discover().all())
    assert pack is not None and problems == [], problems
    return pack


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, list[str]]]:
    """The schema 1.4 fixtures imported once: the pack folder and the report's reasons."""
    out = tmp_path_factory.mktemp("schema14") / "pack"
    report = import_tasks("harbor", SCHEMA14, out, name="test/schema14")
    return out, {**report.imported, **report.skipped}


def test_the_schema14_fixtures_import_or_are_refused_by_name(
    imported: tuple[Path, dict[str, list[str]]],
) -> None:
    out, why = imported
    report = json.loads((out / "import-report.json").read_text())
    assert [t["id"] for t in report["imported"]] == ["allowlist-net", "separate-verifier"]
    [seeded] = report["skipped"]
    assert seeded["id"] == "seeded-trajectory"
    assert (
        "trajectory.json seeds the agent's session with 2 prior ATIF steps" in seeded["reasons"][0]
    )
    tasks = _load(out).tasks

    # [agent] network_mode = "allowlist" over [environment] no-network: the agent's policy.
    net = TerminalPublic.of(tasks["allowlist-net"])
    assert net.allow_internet and net.allowed_hosts == ["pypi.org", "*.pythonhosted.org"]
    spec = TerminalFamily().sandbox_spec(tasks["allowlist-net"])
    assert spec is not None and spec.network
    assert spec.egress_hosts == ("pypi.org", "*.pythonhosted.org")
    assert "egress through the server's proxy to these hosts only" in " ".join(why["allowlist-net"])

    # A separate verifier on its own docker_image: the verifier image, its artifacts in the
    # workdir the verifier receives.
    task = tasks["separate-verifier"]
    public, private = TerminalPublic.of(task), TerminalPrivate.of(task)
    assert not public.allow_internet and private.reward_file
    assert private.verifier["tests/Dockerfile"] == "FROM python:3.13-slim-bookworm\n"
    assert private.verifier_image == task_verifier_tag(private.verifier)
    assert private.harbor["verifier"]["environment_mode"] == "separate"
    assert "docker_image" not in private.harbor["verifier"]["environment"]  # now the image
    notes = " ".join(why["separate-verifier"])
    assert "separate verifier: runs on python:3.13-slim-bookworm" in notes
    assert "artifacts /app/total.txt, /app/report are in the workdir" in notes


def _task_with(src: Path, toml: str, name: str = "t") -> Path:
    folder = src / name
    shutil.copytree(SUM_COLUMN, folder)
    (folder / "task.toml").write_text(toml)
    return folder


@pytest.mark.parametrize(
    ("toml", "reason"),
    [
        ('[environment]\nnetwork_mode = "allowlist"\nallowed_hosts = ["192.0.2.10"]\n',
         "'192.0.2.10' is an IP address or range"),
        ('[agent]\nnetwork_mode = "allowlist"\nallowed_hosts = ["10.0.0.0/8"]\n',
         "'10.0.0.0/8' is an IP address or range"),
        ('[environment]\nnetwork_mode = "allowlist"\nallowed_hosts = ["pypi.org:8443"]\n',
         "is not a host name (no ports"),
        ('[environment]\nnetwork_mode = "sometimes"\n', "is none of no-network, public"),
        ('[environment]\nallowed_hosts = ["pypi.org"]\n', "without network_mode = 'allowlist'"),
        ('artifacts = ["/var/log/app.log"]\n[verifier]\nenvironment_mode = "separate"\n',
         "/var/log/app.log lie outside the workdir /app: the separate verifier needs them"),
        ('artifacts = [{ source = "/data", service = "db" }]\n', "from the service 'db'"),
        ('artifacts = ["/app/../etc"]\n', "has a '..' component"),
        ('[[verifier.collect]]\ncommand = "pg_dump > /app/db.sql"\nservice = "main"\n',
         "[[verifier.collect]] runs 'pg_dump > /app/db.sql'"),
        ('[verifier]\nenvironment_mode = "shared"\n[verifier.environment]\ncpus = 1\n',
         "Harbor refuses the pair"),
        ('[verifier]\nenvironment_mode = "elsewhere"\n', "neither 'shared' nor 'separate'"),
        ("[verifier.environment]\ngpus = 1\n", "the separate verifier asks for 1 GPU(s)"),
        ('[verifier.environment]\nos = "windows"\n', "the verifier sandbox runs Linux"),
        ('schema_version = "2.0"\n', "palaestra reads schemas up to 1.4"),
        ('schema_version = "soon"\n', "is not a version like '1.4'"),
    ],
)  # fmt: skip
def test_what_palaestra_cannot_run_is_refused_at_import(
    tmp_path: Path, toml: str, reason: str
) -> None:
    _task_with(tmp_path / "src", toml)
    _task_with(tmp_path / "src", 'schema_version = "1.4"\n', "fine")
    report = import_tasks("harbor", tmp_path / "src", tmp_path / "out")
    assert list(report.imported) == ["fine"]  # the rest of the set imports
    assert reason in " ".join(report.skipped["t"]), report.skipped


def test_tests_that_read_the_agents_harbor_logs_are_refused(tmp_path: Path) -> None:
    folder = _task_with(tmp_path / "src", 'schema_version = "1.4"\n')
    test_sh = folder / "tests" / "test.sh"
    test_sh.write_text(test_sh.read_text() + "cat /logs/artifacts/summary.txt\n")
    report = import_tasks("harbor", tmp_path / "src", tmp_path / "out")
    assert "the tests read /logs/artifacts (tests/test.sh)" in report.skipped["t"][0]


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ("{not json", "a file that is not ATIF JSON"),
        ("[" * 100_000, "a file that is not ATIF JSON"),  # past the parser's depth
        ("link", "is a symlink or no file"),
        ("fifo", "is a symlink or no file"),  # never opened: an import cannot hang on it
    ],
)
def test_a_seeded_trajectory_is_refused_whatever_it_holds(
    tmp_path: Path, content: str, reason: str
) -> None:
    folder = _task_with(tmp_path / "src", 'schema_version = "1.4"\n')
    if content == "link":
        (folder / "trajectory.json").symlink_to("/etc/passwd")
    elif content == "fifo":
        os.mkfifo(folder / "trajectory.json")
    else:
        (folder / "trajectory.json").write_text(content)
    report = import_tasks("harbor", tmp_path / "src", tmp_path / "out")
    assert reason in report.skipped["t"][0], report.skipped


def test_a_newer_minor_schema_imports_with_a_note(tmp_path: Path) -> None:
    _task_with(tmp_path / "src", 'schema_version = "1.5"\n')
    report = import_tasks("harbor", tmp_path / "src", tmp_path / "out")
    assert "schema 1.5 is newer than 1.4" in " ".join(report.imported["t"])


def test_older_names_are_kept_in_schema14s(tmp_path: Path) -> None:
    """`version` and `allow_internet` (Harbor's migrations): imported as schema 1.4 names, and
    a pack imported before keeps them until its export writes 1.4's."""
    toml = 'version = "1.0"\n[environment]\nallow_internet = true\n'
    toml += "[verifier.environment]\nallow_internet = false\n"
    _task_with(tmp_path / "src", toml)
    import_tasks("harbor", tmp_path / "src", tmp_path / "out")
    task = _load(tmp_path / "out").tasks["t"]
    kept = TerminalPrivate.of(task).harbor
    assert kept["environment"] == {"network_mode": "public"} and "version" not in kept
    assert kept["verifier"]["environment"] == {"network_mode": "no-network"}
    assert TerminalPublic.of(task).allow_internet

    legacy = {"version": "1.0", "environment": {"allow_internet": True}}
    old = _native({"allow_internet": True}, harbor=legacy)
    config = task_config(old, "p")
    assert config["schema_version"] == "1.4" and "version" not in config
    assert config["environment"]["network_mode"] == "public"
    assert "allow_internet" not in config["environment"]


def _native(public: dict[str, object], **private: object) -> Task:
    given = {"verifier": {"test.sh": "exit 1\n"}, "solution": {"solve.sh": ":"}, **private}
    return Task(id="n", family="terminal", domain="p/misc", split="train", pack="p/p",
                version="1", difficulty="easy", public={"instruction": "x", **public},
                private=given)  # fmt: skip


def test_a_tasks_network_is_written_in_schema14s_modes() -> None:
    def env(public: dict[str, object]) -> dict[str, object]:
        return task_config(_native(public), "p")["environment"]

    assert env({})["network_mode"] == "no-network"
    assert env({"allow_internet": True})["network_mode"] == "public"
    hosts = env({"allow_internet": True, "allowed_hosts": ["pypi.org"]})
    assert (hosts["network_mode"], hosts["allowed_hosts"]) == ("allowlist", ["pypi.org"])


def test_import_export_import_keeps_the_schema14_fields(
    imported: tuple[Path, dict[str, list[str]]], tmp_path: Path
) -> None:
    out, _ = imported
    first = _load(out).tasks
    report = export_tasks(list(first.values()), tmp_path / "h", pack="test/schema14", version="1")
    assert sorted(report.exported) == ["allowlist-net", "separate-verifier"]
    folder = tmp_path / "h" / "separate-verifier"
    config = tomllib.loads((folder / "task.toml").read_text())
    assert config["schema_version"] == "1.4"
    # Harbor's separate verifier gets the agent's workdir, first (what it holds is covered),
    # and runs the exported tests on the task's verifier image.
    assert config["artifacts"][0] == "/app" and config["artifacts"][1] == "/app/total.txt"
    assert config["verifier"]["environment_mode"] == "separate"
    dockerfile = (folder / "tests" / "Dockerfile").read_text()
    assert dockerfile == "FROM python:3.13-slim-bookworm\nCOPY . /tests/\n"
    agent = tomllib.loads((tmp_path / "h" / "allowlist-net" / "task.toml").read_text())["agent"]
    assert agent["network_mode"] == "allowlist"
    import_tasks("harbor", tmp_path / "h", tmp_path / "back", name="test/schema14")
    again = _load(tmp_path / "back").tasks
    assert {k: (t.public, t.private) for k, t in again.items()} == {
        k: (t.public, t.private) for k, t in first.items()
    }


def test_the_import_summary_names_the_schema14_refusals(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from palaestra.cli.main import app

    out = tmp_path / "pack"
    result = CliRunner().invoke(app, ["pack", "import", "harbor", str(SCHEMA14), str(out), "-v"])
    assert result.exit_code == 0, result.output
    assert "2 imported, 1 skipped (1 × seeded trajectory)" in result.output


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.skipif(not bwrap_available()[0], reason=f"bwrap unavailable: {bwrap_available()[1]}")
@pytest.mark.skipif(os.geteuid() != 0, reason="egress through the proxy needs a root server")
def test_the_imported_schema14_tasks_run_without_a_void(
    imported: tuple[Path, dict[str, list[str]]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`pack check` through the real server and bwrap sandboxes: the allow-list task in its
    narrowed egress sandbox, the separate verifier's task given its artifacts in the workdir:
    oracle 1, null 0, every cheat ≤ 0.1, no void."""
    from typer.testing import CliRunner

    from palaestra.cli.main import app

    monkeypatch.chdir(tmp_path)
    shutil.copytree(imported[0], tmp_path / "pack")
    result = CliRunner().invoke(app, ["pack", "check", "pack"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "oracle 2/2 pass, null 2/2 zero, cheats 2/2 ≤ 0.1, void 0" in result.output


def test_a_tasks_own_network_fields_survive_export_and_import(tmp_path: Path) -> None:
    """The network_mode the writer derives from allow_internet / allowed_hosts is generated
    (an import keeps it out of `private.harbor`); the fields come back as the task gave them."""
    given: list[dict[str, object]] = [
        {},
        {"allow_internet": False},
        {"allow_internet": True},
        {"allow_internet": True, "allowed_hosts": ["pypi.org", "*.pythonhosted.org"]},
    ]
    tasks = [dataclasses.replace(_native(p), id=f"n{i}") for i, p in enumerate(given)]
    export_tasks(tasks, tmp_path / "h", pack="p/p", version="1")
    import_tasks("harbor", tmp_path / "h", tmp_path / "back", name="p/p")
    back = _load(tmp_path / "back").tasks
    for i, public in enumerate(given):
        task = back[f"n{i}"]
        assert {k: task.public[k] for k in public} == public, task.public
        assert set(task.public) & {"allow_internet", "allowed_hosts"} == set(public)
        assert TerminalPrivate.of(task).harbor == {}


@pytest.mark.parametrize(
    ("operator", "unreachable"),
    [(DEFAULT_ALLOW, None), (("pypi.org",), "*.pythonhosted.org"), ((), "pypi.org, *.pyth")],
)
def test_hosts_this_servers_egress_allow_lacks_are_noted(
    tmp_path: Path, operator: tuple[str, ...], unreachable: str | None
) -> None:
    limits = Ceilings(memory_mb=4096, cpus=4.0, workspace_mb=4096, task_timeout_s=600.0,
                      wall_s=3600.0, egress_allow=operator)  # fmt: skip
    report = import_tasks("harbor", SCHEMA14 / "allowlist-net", tmp_path / "o", ceilings=limits)
    notes = " ".join(report.imported["allowlist-net"])
    assert ("not on this server's egress_allow" in notes) is (unreachable is not None), notes
    if unreachable is not None:
        assert f"allowed_hosts {unreachable}" in notes
