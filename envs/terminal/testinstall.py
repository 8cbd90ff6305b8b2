"""A terminal task's test-time installs (envs/terminal/installs.py), run for its verifier.

The install runs in a sandbox of its own, on the verifier's spec, that never holds a file of
the agent's: its network is the egress proxy narrowed to the task's `verifier_hosts` (each
also on the operator's egress_allow), with the proxy variables (HTTP(S)_PROXY) every
networked sandbox gets. What pip installed there (``--target``, a folder of that sandbox's
empty workdir) comes back as a tar that the verifier stages after its own files: the runner
unpacks it into VERIFIER_DIR (a folder no agent process saw, hidden from the agent's
programs the tests start) and import_guard.py puts it on the verifier's Python path ahead of
the interpreter's packages. The verification sandbox keeps no network: no code of the
agent's runs with it, and nothing the agent wrote is installed from or into."""

from __future__ import annotations

import asyncio
import dataclasses
import posixpath
from collections.abc import Sequence

from palaestra.envs import (
    ExecResult,
    Sandbox,
    SandboxError,
    Sandboxes,
    SandboxPathError,
    SandboxSpec,
)
from palaestra.sandbox.docker.standins import PYTHON
from palaestra.verifiers.terminal import VERIFIER_SITE

INSTALL_TIMEOUT_S = 300.0
NO_PIP = "No module named pip"
MAX_SITE_BYTES = 128 * 1024 * 1024  # what one task's installs may take (held in memory)
PIP = ("python3", "-I", "-m", "pip", "install", "--no-input", "--disable-pip-version-check",
       "--no-warn-script-location", "--no-compile", "--target")  # fmt: skip


async def install_for(
    sandboxes: Sandboxes, verifier: Sandbox, requirements: Sequence[str], hosts: Sequence[str]
) -> bytes:
    """Install `requirements` from `hosts` in a fresh networked sandbox (of `verifier`'s
    spec); returns a tar of them (one folder, VERIFIER_SITE) for the verifier's files. A
    failure is ours (the registry, the proxy, a limit): SandboxError, which voids the
    episode, never the agent's 0."""
    spec = dataclasses.replace(
        verifier.spec, network=True, egress_hosts=tuple(hosts), traces_execs=False
    )
    target = posixpath.join(spec.workdir, VERIFIER_SITE)
    argv = [*PIP, target, *requirements]
    box, result = await _pip(sandboxes, spec, argv)
    if not result.ok and NO_PIP in result.stderr and spec.image != PYTHON:
        # an image without pip (the terminal image): the Python stand-in's pip, the same
        # Debian python3 (docs/terminal.md, "Test-time installs")
        box, result = await _pip(sandboxes, dataclasses.replace(spec, image=PYTHON), argv)
    if not result.ok:
        tail = (result.stdout + result.stderr)[-1500:]
        raise SandboxError(
            f"the tests' installs ({' '.join(requirements)}) failed through the egress proxy "
            f"(exit {result.exit_code}{', timed out' if result.timed_out else ''}): {tail}"
        )
    with sandboxes.spool() as tar:
        try:
            await box.download_tar_to(tar, target, limit=MAX_SITE_BYTES)
        except SandboxPathError as exc:
            raise SandboxError(f"the tests' installs cannot be copied: {exc}") from None
        tar.seek(0)
        return await asyncio.to_thread(tar.read)


async def _pip(
    sandboxes: Sandboxes, spec: SandboxSpec, argv: list[str]
) -> tuple[Sandbox, ExecResult]:
    box = await sandboxes.verifier(spec)
    return box, await box.exec(argv, cwd="/tmp", timeout=INSTALL_TIMEOUT_S)
