"""Where a harness's own code comes from inside the sandbox: a toolchain directory built by
scripts/bootstrap-harness.sh, bound read-only and put on PYTHONPATH for the sandbox's
/usr/bin/python3 (the host's under bwrap, the image's under docker: CPython 3.11 both).

``mini-swe-agent``: ``<toolchains>/mini-swe-agent`` (mini-swe-agent 2.4.6, litellm and the
rest of scripts/harness-mini-swe-agent.txt), bound at /opt/palaestra/mini-swe-agent.
``<toolchains>`` is found as the cad family's are (envs/cad/runtime.py: the `toolchains_dir`
setting, else /opt/palaestra/toolchains, else ``.toolchains`` in the checkout). PYTHONPATH
runs no ``.pth`` file, so nothing of the server is importable inside.

``acp``: ``<toolchains>/acp`` (agent-client-protocol 0.12.1 and pydantic, scripts/harness-acp.txt),
bound at /opt/palaestra/acp, which the ACP reference agent runs on (server/harness/acp.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from palaestra.envs.cad.runtime import host_python_version, toolchains_root, unreachable_by_others

MINI_SWE_AGENT = "mini-swe-agent"
SANDBOX_DIR = "/opt/palaestra/mini-swe-agent"
ACP = "acp"
ACP_DIR = "/opt/palaestra/acp"
PYTHON_VERSION = (3, 11)  # the wheels' (cp311): the host's and the images' python3


@dataclass(frozen=True)
class HarnessToolchain:
    """A toolchain directory (`site`, None when unavailable, with the `reason`)."""

    name: str
    site: str | None
    reason: str = ""
    target: str = SANDBOX_DIR  # where it is bound inside

    @property
    def available(self) -> bool:
        return self.site is not None

    def ro_bind(self) -> tuple[str, str]:
        """The `SandboxSpec.ro_binds` entry that makes it importable inside."""
        if self.site is None:
            raise RuntimeError(f"the {self.name} toolchain is unavailable: {self.reason}")
        return (self.site, self.target)

    def env(self, workdir: str) -> dict[str, str]:
        """What the harness process runs with: its code on PYTHONPATH, HOME the workdir,
        no network look-ups at start (litellm's bundled cost map, no setup prompt, no
        banner), its config dir in /tmp (not the agent's workspace), and one attempt a model
        call (the proxy answers at once; a refused call ends the run, not 10 retries)."""
        return {
            "PYTHONPATH": self.target,
            "PYTHONNOUSERSITE": "1",
            "HOME": workdir,
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "LITELLM_LOG": "ERROR",
            "DO_NOT_TRACK": "1",
            "MSWEA_CONFIGURED": "true",
            "MSWEA_SILENT_STARTUP": "1",
            "MSWEA_GLOBAL_CONFIG_DIR": "/tmp/mini-swe-agent",
            "MSWEA_COST_TRACKING": "ignore_errors",
            "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": "1",
        }


def mini_swe_agent(root: Path | None = None, *, host_python: bool = True) -> HarnessToolchain:
    """The mini-swe-agent toolchain under `root` (the `toolchains_dir` setting; None: the
    bootstrap script's rule). `host_python`: the sandbox runs the host's /usr/bin/python3
    (bwrap without an image), which must be 3.11 too."""
    return find(MINI_SWE_AGENT, "minisweagent", SANDBOX_DIR, root, host_python=host_python)


def acp(root: Path | None = None, *, host_python: bool = True) -> HarnessToolchain:
    """The ACP SDK's toolchain under `root`, as `mini_swe_agent`."""
    return find(ACP, "acp", ACP_DIR, root, host_python=host_python)


def find(
    name: str, package: str, target: str, root: Path | None = None, *, host_python: bool = True
) -> HarnessToolchain:
    """The toolchain `name` (its `package` imported from it) under `root`, bound at `target`;
    unavailable, with the reason and the fix, where it is not built or cannot run here."""
    site = toolchains_root(root) / name
    why = site / "UNAVAILABLE"
    if why.is_file():
        return HarnessToolchain(name, None, why.read_text().strip(), target)
    if not (site / package).is_dir() or not (site / ".palaestra-installed").is_file():
        return HarnessToolchain(
            name, None, f"not built at {site}: run scripts/bootstrap-harness.sh", target
        )
    if host_python and host_python_version() != PYTHON_VERSION:
        return HarnessToolchain(
            name,
            None,
            f"/usr/bin/python3 is {host_python_version()}, the toolchain's wheels are for 3.11",
            target,
        )
    if (unreadable := unreachable_by_others(site)) is not None:
        return HarnessToolchain(name, None, unreadable, target)
    return HarnessToolchain(name, str(site), target=target)
