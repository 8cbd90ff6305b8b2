"""ACP harnesses: an Agent Client Protocol agent driven over one persistent session in the
episode's sandbox (docs/harness.md, "ACP harnesses").

The harness process is palaestra's ACP client (programs/acp_client.py, standard library):
it starts the agent with the argv after `--`, runs `initialize`, `session/new` (cwd: the
workspace) and one `session/prompt` with the instruction, answers the agent's fs, terminal
and permission requests inside the workspace, and exits when the turn ends. The client runs
in the sandbox beside the agent, not in the server, so what it does for the agent is walled
in twice: by its own workspace rule, and by the sandbox, which holds none of the server's
files (docs/decisions.md). The agent's model calls go to the session proxy like any
harness's (`OPENAI_BASE_URL`), recorded with their token ids.

`acp_harness` makes an entry for any ACP agent; `ACP_AGENT` is the one every server has:
the reference agent on the protocol's own SDK (programs/acp_agent.py, the `acp` toolchain).
"""

from __future__ import annotations

import json
from collections.abc import Callable

from pydantic import Field

from palaestra.sandbox.base import ExecResult
from palaestra.sdk.failures import Failure, FailureKind
from palaestra.server.config import Settings
from palaestra.server.harness import toolchain
from palaestra.server.harness.registry import (
    PROGRAMS_TARGET,
    PYTHON,
    Bound,
    Harness,
    HarnessConfig,
    Launch,
    Outcome,
    programs,
)

MARKER = "palaestra-acp: "  # the client's last stdout line (programs/acp_client.py)
PROTOCOL_CLASS = "harness_protocol"  # the failure class of an agent that broke ACP
ENDS = {
    "agent_exited": "the ACP agent exited before its prompt turn ended",
    "agent_error": "the ACP agent answered the client's request with an error",
}


class AcpAgentConfig(HarnessConfig):
    max_turns: int = Field(default=30, ge=1, le=1000, description="model calls at most")
    command_timeout_s: float = Field(default=30.0, gt=0, le=600, description="one command")


def client_argv(launch: Launch, agent: list[str]) -> list[str]:
    """The harness's argv: palaestra's ACP client, which starts `agent`."""
    return [
        PYTHON,
        f"{PROGRAMS_TARGET}/acp_client.py",
        "--instruction-file",
        launch.instruction_path,
        "--workspace",
        launch.workdir,
        "--",
        *agent,
    ]


def outcome(result: ExecResult) -> Outcome | None:
    """How the ACP session ended, from the client's last `palaestra-acp:` line. A broken
    protocol is the agent's failure (kind `agent_crash`, class `harness_protocol`): whatever
    runs in the sandbox can write into the agent's pipes, so the policy can cause it."""
    end = None
    for line in reversed(result.stdout.splitlines()):
        if line.startswith(MARKER):
            try:
                end = json.loads(line[len(MARKER) :])
            except ValueError:
                end = None
            break
    if not isinstance(end, dict) or not isinstance(end.get("end"), str):
        return None  # the client died before its account: "exited with code N"
    detail = str(end.get("detail", ""))[:1000]
    if end["end"] == "stop":
        return Outcome(f"the ACP prompt turn ended: {str(end.get('stop_reason'))[:64]}")
    if end["end"] == "protocol_error":
        reason = f"the ACP agent broke the protocol: {detail}"
        failure = Failure.of(
            FailureKind.AGENT_CRASH, reason, failure_class=PROTOCOL_CLASS,
            exit_code=result.exit_code,
        )  # fmt: skip
        return Outcome(reason, failure)
    what = ENDS.get(end["end"], f"the ACP session ended: {end['end'][:64]}")
    return Outcome(f"{what}: {detail}" if detail else what)


def acp_harness(
    name: str,
    description: str,
    agent: Callable[[Launch, HarnessConfig], list[str]],
    config_model: type[HarnessConfig],
    needs: Callable[[Settings], Bound],
    extra_env: Callable[[Launch], dict[str, str]] = lambda _: {},
    install: str = "",
) -> Harness:
    """A registry entry for the ACP agent `agent` (its argv), driven by palaestra's client;
    `needs` binds the agent's own code (the client's programs are bound too)."""

    def both(settings: Settings) -> Bound:
        own, client = needs(settings), programs(settings)
        why = own.unavailable or client.unavailable
        if why is not None:
            return Bound(unavailable=why)
        return Bound(ro_binds=client.ro_binds + own.ro_binds, env=own.env)

    return Harness(
        name=name,
        description=description,
        config_model=config_model,
        argv=lambda launch, config: client_argv(launch, agent(launch, config)),
        needs=both,
        extra_env=extra_env,
        install=install,
        outcome=outcome,
    )


# -- the reference agent ----------------------------------------------------------------------


def _sdk(settings: Settings) -> Bound:
    chain = toolchain.acp(settings.toolchains_dir, host_python=settings.sandbox == "bwrap")
    if chain.site is None:
        return Bound(unavailable=chain.reason)
    env = (("PYTHONPATH", chain.target), ("PYTHONNOUSERSITE", "1"))
    return Bound(ro_binds=(chain.ro_bind(),), env=env)


def _reference(launch: Launch, config: HarnessConfig) -> list[str]:
    assert isinstance(config, AcpAgentConfig)
    return [
        PYTHON,
        f"{PROGRAMS_TARGET}/acp_agent.py",
        "--max-turns",
        str(config.max_turns),
        "--command-timeout",
        f"{config.command_timeout_s:g}",
    ]


ACP_AGENT = acp_harness(
    name="acp-agent",
    description="the ACP reference agent (agent-client-protocol's SDK) over palaestra's ACP "
    "client: bash, write_file, read_file as terminal and fs requests",
    agent=_reference,
    config_model=AcpAgentConfig,
    needs=_sdk,
    install="run scripts/bootstrap-harness.sh as root (installs the acp toolchain)",
)
