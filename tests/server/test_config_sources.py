"""Settings is the only source of configuration: no module reads the environment but the
Settings loader (server/config.py), save the exceptions below, each with its reason."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

from palaestra.server.config import Settings, load_settings_with_sources

ROOT = Path(__file__).resolve().parents[2]
# sandbox/ joins this list when its backends take their settings as arguments (issue 16).
FOLDERS = ("server", "cli", "envs", "verifiers", "sandbox", "sdk", "scripts", "bench")
ALLOWED = {
    "server/config.py": "the Settings loader: flag, then PALAESTRA_<NAME>, then palaestra.toml",
    "verifiers/programs/terminal_runner.py": "a program run inside the verifier's sandbox: "
    "it reads the "
    "environment the verifier gave its own process",
    "verifiers/programs/pytest_boot.py": "a program run inside the verifier's sandbox: the "
    "pytest config and verifier folder its runner handed it",
    "verifiers/programs/uv_boot.py": "a program run inside the verifier's sandbox: the uv "
    "wrappers read the environment its runner set",
    "verifiers/programs/import_guard.py": "a program run inside the verifier's sandbox: the "
    "workdir and verifier folder its runner handed it",
    "verifiers/programs/agent_jail.py": "a program run inside the verifier's sandbox: the "
    "paths its runner hides from the agent's programs",
    "envs/cheat_scripts/forge.py": "a cheat program run inside the agent's sandbox",
    "server/harness/programs/bash_agent.py": "the built-in harness, run inside the episode's "
    "sandbox: OPENAI_BASE_URL/OPENAI_MODEL are the session proxy the runner gave it",
    "server/harness/programs/acp_agent.py": "the reference ACP agent, run inside the "
    "episode's sandbox: OPENAI_BASE_URL/OPENAI_MODEL are the session proxy the runner gave it",
    "sdk/policies/chat.py": "the key of the user's model endpoint, in the variable "
    "--api-key-env names (never stored; no palaestra setting)",
    "sandbox/docker/engine.py": "DOCKER_HOST, the docker SDK's own variable for the engine's "
    "socket (what `docker` itself reads)",
    "sandbox/exechelper.py": "CC, the compiler the exec helper is built with (the build's own "
    "convention)",
    "server/cluster/rayauth.py": "RAY_AUTH_TOKEN and RAY_AUTH_TOKEN_PATH, Ray's own variables "
    "for its token (what Ray itself reads), to know whether one is set and to close its file",
}


def _is_environ(node: ast.expr) -> bool:
    """`os.environ` or a bare `environ`."""
    if isinstance(node, ast.Attribute):
        return node.attr == "environ"
    return isinstance(node, ast.Name) and node.id == "environ"


def environment_reads(path: Path) -> list[str]:
    """Where `path` reads a variable: `os.environ.get(…)`, `os.environ[…]`, `os.getenv(…)`,
    `… in os.environ`. Passing the environment on to a child (`{**os.environ}`) is no read."""
    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        read = False
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            read = (node.func.attr == "get" and _is_environ(node.func.value)) or (
                node.func.attr == "getenv"
            )
        elif isinstance(node, ast.Subscript):
            read = _is_environ(node.value) and isinstance(node.ctx, ast.Load)
        elif isinstance(node, ast.Compare):
            read = any(isinstance(op, ast.In | ast.NotIn) for op in node.ops) and any(
                _is_environ(c) for c in node.comparators
            )
        if read:
            found.append(f"{where}:{getattr(node, 'lineno', 0)}")
    return found


def tracked_sources() -> list[Path]:
    """The project's own Python files under FOLDERS (not ignored venvs and caches)."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", *FOLDERS],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [ROOT / line for line in sorted(out.splitlines()) if line.endswith(".py")]


def test_only_the_settings_loader_reads_the_environment() -> None:
    reads = [
        where
        for path in tracked_sources()
        if str(path.relative_to(ROOT)) not in ALLOWED
        for where in environment_reads(path)
    ]
    assert not reads, f"read these through Settings (server/config.py) and pass them down: {reads}"


def test_every_exception_still_reads_the_environment() -> None:
    """An allow-list entry whose module no longer reads the environment goes."""
    stale = [rel for rel in ALLOWED if not environment_reads(ROOT / rel)]
    assert not stale, stale


def test_the_scan_finds_reads(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import os\nfrom os import environ\n"
        "a = os.environ.get('A')\nb = os.environ['B']\nc = os.getenv('C')\n"
        "d = 'D' in environ\ne = {**os.environ}\nos.environ['F'] = 'f'\n"
    )
    assert [w.rsplit(":", 1)[1] for w in environment_reads(probe)] == ["3", "4", "5", "6"]


def test_the_loader_reads_every_setting_and_says_from_where(tmp_path: Path) -> None:
    config = tmp_path / "palaestra.toml"
    config.write_text('sandbox = "docker"\nport = 9001\n')
    environ = {
        "PALAESTRA_PORT": "9002",
        "PALAESTRA_HELDOUT_SECRET_FILE": str(tmp_path / "s"),
        "PALAESTRA_CACHE": str(tmp_path / "cache"),
        "PALAESTRA_FORKSERVER": "0",
        "E2B_API_KEY": "k-1",
    }
    settings, sources = load_settings_with_sources(
        {"host": "0.0.0.0"}, environ=environ, config_file=config
    )
    assert settings.host == "0.0.0.0" and sources["host"] == "flag"
    assert settings.port == 9002 and sources["port"] == "PALAESTRA_PORT"  # env over the file
    assert settings.sandbox == "docker" and sources["sandbox"] == str(config)
    assert settings.heldout_secret_file == tmp_path / "s"
    assert settings.cache == tmp_path / "cache" and settings.forkserver is False
    assert settings.e2b_api_key is not None and settings.e2b_api_key.get_secret_value() == "k-1"
    assert "k-1" not in settings.model_dump_json()  # a secret never prints
    assert sources["max_steps"] == "default"
    assert set(sources) == set(Settings.model_fields)
    # An embedded Settings() reads nothing: the loader is the one door.
    assert Settings().heldout_secret_file is None
