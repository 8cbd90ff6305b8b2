"""`pack import --build`: a task whose environment does not build here is refused at import.

Static checks at import name most of what cannot run here (a base image with no stand-in, a
download from a host builds cannot reach: envs/terminal/baseimages.py, downloads.py), but
only a build knows the rest: an apt package the stand-in's Debian release lacks
(`openjdk-21-jdk` on bookworm), a vendor script that fails behind the site's proxy. With
`--build` those tasks leave the pack and join the import report's refusals, with the line
of the build log that says why, so none of them is left to void at its first episode.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from palaestra.envs.terminal.envimage import BuildResult
from palaestra.sdk.packwriter import ImportReport, write_report

CLASS_PATTERN = r"does not build here"  # its class in the import summary (pack_import.py)
_SAID = re.compile(r"error|not found|could not|unable|denied|timed? ?out|no such|failed", re.I)


def cause_line(cause: str) -> str:
    """The line of a build cause that says what went wrong (else its last line), and the
    step it failed at where the log names one."""
    lines = [ln.strip() for ln in cause.splitlines() if ln.strip()]
    step = next((ln for ln in lines if ln.startswith("Step ")), "")
    said = next((ln for ln in lines if _SAID.search(ln) and not ln.startswith("Step ")), "")
    line = (said or (lines[-1] if lines else "no build log"))[:200]
    if step:
        line += f" (at {step.split(':', 1)[-1].strip()[:120]})"
    return line


def refuse_unbuilt(report: ImportReport, results: list[BuildResult], out: Path) -> list[str]:
    """Move each task of a failed environment from the pack to the report's refusals (and
    rewrite OUT/import-report.json); the ids refused."""
    refused: list[str] = []
    for result in results:
        if result.status != "failed":
            continue
        reason = (
            f"its environment does not build here: {cause_line(result.cause)}; "
            f"`palaestra images build --pack {out}` shows the whole cause"
        )
        for task in result.tasks:
            if task in report.imported:
                report.imported.pop(task)
                report.skipped[task] = [reason]
                shutil.rmtree(out / "tasks" / task, ignore_errors=True)
                refused.append(task)
    if refused:
        write_report(out, report)
    return refused
