"""The `mini-swe-agent` harness entry (PyPI mini-swe-agent 2.x, its `mini` program).

It runs from the toolchain scripts/bootstrap-harness.sh installs (server/harness/
toolchain.py says where, and binds it read-only). Its whole configuration, the task
included, is one file written into the sandbox: JSON, which is YAML, so no value a client
sends is ever parsed as a flag or reaches a shell. The model is litellm's `openai/<model>`
at the session proxy's base URL; cost tracking is off (a local model has no price).
"""

from __future__ import annotations

import json

from pydantic import Field

from palaestra.server.config import Settings
from palaestra.server.harness import toolchain
from palaestra.server.harness.registry import PYTHON, Bound, Harness, HarnessConfig, Launch

CONFIG_FILE = "mini-palaestra.yaml"  # JSON text; mini takes only .yaml names
TRAJECTORY_FILE = "mini.traj.json"


class MiniSweConfig(HarnessConfig):
    step_limit: int = Field(default=30, ge=1, le=1000, description="agent steps at most")
    command_timeout_s: int = Field(default=30, ge=1, le=600, description="one command")


def _needs(settings: Settings) -> Bound:
    # bwrap runs a spec without an image on the host's python3; docker on the image's.
    chain = toolchain.mini_swe_agent(
        settings.toolchains_dir, host_python=settings.sandbox == "bwrap"
    )
    if chain.site is None:
        return Bound(unavailable=chain.reason)
    return Bound(ro_binds=(chain.ro_bind(),))


def _env(launch: Launch) -> dict[str, str]:
    """The toolchain's environment (its code on PYTHONPATH, no first-run prompt or network
    look-up, one attempt a model call)."""
    return toolchain.HarnessToolchain(toolchain.MINI_SWE_AGENT, None).env(launch.workdir)


def _argv(launch: Launch, config: HarnessConfig) -> list[str]:
    return [
        PYTHON,
        "-m",
        "minisweagent.run.mini",
        "-c",
        "mini.yaml",
        "-c",
        launch.path(CONFIG_FILE),
        "--yolo",
        "--exit-immediately",
        "-o",
        launch.path(TRAJECTORY_FILE),
    ]


def _files(launch: Launch, config: HarnessConfig) -> dict[str, str]:
    assert isinstance(config, MiniSweConfig)
    body = {
        "run": {"task": launch.instruction},
        "agent": {"step_limit": config.step_limit, "cost_limit": 0.0},
        "environment": {"environment_class": "local", "timeout": config.command_timeout_s},
        "model": {
            "model_class": "litellm",
            "model_name": f"openai/{launch.model}",
            "cost_tracking": "ignore_errors",
            "model_kwargs": {"api_base": launch.base_url, "api_key": "palaestra-session"},
        },
    }
    return {CONFIG_FILE: json.dumps(body, indent=1)}


MINI_SWE_AGENT = Harness(
    name="mini-swe-agent",
    description="mini-swe-agent (PyPI), the SWE-agent team's 100-line bash agent",
    config_model=MiniSweConfig,
    argv=_argv,
    files=_files,
    extra_env=_env,
    needs=_needs,
    install="run scripts/bootstrap-harness.sh as root (installs it under the toolchains dir)",
)
