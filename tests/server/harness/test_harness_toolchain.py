"""The mini-swe-agent toolchain (scripts/bootstrap-harness.sh, server/harness/toolchain.py):
its CLI and the modules of a non-interactive run import inside a bwrap sandbox and a docker
one, both without network, from the one read-only directory; and what the finder says when
it is missing."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from adversarial.harness import BACKENDS, make_backend

from palaestra.sandbox.base import SandboxSpec
from palaestra.server.harness.toolchain import SANDBOX_DIR, mini_swe_agent

CHAIN = mini_swe_agent()
IMPORTS = (
    "import time; t = time.monotonic(); import minisweagent.run.mini, minisweagent.agents.default,"
    " minisweagent.models.litellm_model, minisweagent.environments.local, litellm;"
    " print(round(time.monotonic() - t, 2))"
)


@pytest.mark.skipif(not CHAIN.available, reason=f"mini-swe-agent toolchain: {CHAIN.reason}")
@pytest.mark.parametrize("backend_name", BACKENDS)
async def test_mini_swe_agent_runs_inside_without_network(backend_name: str) -> None:
    backend = make_backend(backend_name)
    spec = SandboxSpec(memory_mb=1024, pids=64, default_timeout_s=60.0, ro_binds=(CHAIN.ro_bind(),))
    env = CHAIN.env(spec.workdir)
    try:
        async with await backend.create(spec) as box:
            t = time.monotonic()
            r = await box.exec(["python3", "-m", "minisweagent.run.mini", "--help"], env=env)
            help_s = time.monotonic() - t
            assert r.exit_code == 0, r
            assert "--exit-immediately" in r.stdout and "--cost-limit" in r.stdout, r
            t = time.monotonic()
            r = await box.exec(["python3", "-c", IMPORTS], env=env)
            start_s = time.monotonic() - t
            assert r.exit_code == 0, r
            ls = await box.exec(["ls", "-A", spec.workdir])
            assert ls.stdout == "", ls  # nothing of the harness's start lands in the workspace
            w = await box.exec(["touch", f"{SANDBOX_DIR}/x"])
            assert w.exit_code != 0  # read-only
    finally:
        await backend.aclose()
    print(f"{backend_name}: --help {help_s:.2f}s; import {r.stdout.strip()}s, exec {start_s:.2f}s")


def test_the_finder_says_why_it_is_missing(tmp_path: Path) -> None:
    assert "run scripts/bootstrap-harness.sh" in mini_swe_agent(tmp_path).reason
    (tmp_path / "mini-swe-agent").mkdir()
    (tmp_path / "mini-swe-agent" / "UNAVAILABLE").write_text("pip install --target failed: x\n")
    chain = mini_swe_agent(tmp_path)
    assert not chain.available and chain.reason == "pip install --target failed: x"
    with pytest.raises(RuntimeError, match="unavailable: pip install"):
        chain.ro_bind()


def test_the_harness_env() -> None:
    env = mini_swe_agent(Path("/nonexistent")).env("/work")
    assert env["PYTHONPATH"] == SANDBOX_DIR and env["HOME"] == "/work"
    assert env["LITELLM_LOCAL_MODEL_COST_MAP"] == "True" and env["MSWEA_CONFIGURED"] == "true"
    assert not env["MSWEA_GLOBAL_CONFIG_DIR"].startswith("/work")
