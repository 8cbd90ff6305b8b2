"""Files an oracle solution carries, written by its solve.sh before it runs.

A terminal task's solution is one script (`solve.sh`), which the pack check runs as the
oracle. Harbor tasks have other files beside it (`solution/`), and Terminal-Bench's dataset
adapters (aider_polyglot) leave an encrypted reference payload in the agent's workspace
(`workspace/.oracle/solution.enc`) that `solution.sh` decrypts with a password written in
solution.sh itself: in the agent's image that payload *is* the answer, one `openssl` away.
Both become heredocs at the head of solve.sh, so they exist only while the oracle runs and
never in the agent's environment.
"""

from __future__ import annotations

import base64
import posixpath
import shlex
from collections.abc import Callable
from pathlib import Path

from palaestra.envs.terminal.dockerfile import EnvPlan

# The folder Terminal-Bench's adapters keep the oracle's payload in, inside the workspace.
ORACLE_DIR = ".oracle"


def file_writes(
    files: dict[str, str], binaries: dict[str, Path], target: Callable[[str], str]
) -> list[str]:
    """Shell lines writing each file (binary ones in base64) to `target(rel)` (a quoted
    shell word), its folder made first."""
    lines: list[str] = []
    for rel, path in sorted(binaries.items()):
        lines.append(f'mkdir -p "$(dirname {target(rel)})"')
        data = base64.encodebytes(path.read_bytes()).decode()
        lines.append(f"base64 -d > {target(rel)} <<'PALAESTRA_EOF'\n{data}PALAESTRA_EOF")
    for rel, text in sorted(files.items()):
        tag = "PALAESTRA_EOF"
        while tag in text:
            tag += "_"
        lines.append(f'mkdir -p "$(dirname {target(rel)})"')
        newline = "" if text.endswith("\n") else "\n"
        lines.append(f"cat > {target(rel)} <<'{tag}'\n{text}{newline}{tag}")
    return lines


def take_oracle_payload(plan: EnvPlan, solve: str) -> tuple[str, list[str]]:
    """Move the workspace's `.oracle/` files (see the module doc) out of the environment
    `plan` into `solve`, written where the image had them; (the solve script, notes)."""

    def carried(rel: str) -> bool:
        return ORACLE_DIR in rel.split("/")

    files = {rel: plan.files.pop(rel) for rel in [r for r in plan.files if carried(r)]}
    binaries = {rel: plan.binaries.pop(rel) for rel in [r for r in plan.binaries if carried(r)]}
    if not files and not binaries:
        return solve, []
    workdir = plan.workdir

    def target(rel: str) -> str:
        return shlex.quote(posixpath.normpath(posixpath.join(workdir, rel)))

    head, _, body = solve.partition("\n") if solve.startswith("#!") else ("#!/bin/bash", "", solve)
    written = sorted({*files, *binaries})
    note = (
        f"the oracle's payload in the workspace ({', '.join(written)}) goes with the solution "
        f"(written under {workdir} when the oracle runs), never into the agent's environment"
    )
    return "\n".join([head, *file_writes(files, binaries, target), body]), [note]
