"""docs/writing-a-pack.md, followed as an author would from an empty folder: the page's blocks
in order, as one bash script of `palaestra` subprocesses (tests/docblocks.py says how blocks
are marked) — write a family, install it as an entry point, scaffold a generator pack,
check and materialize it, start a server, make a publish token, publish, install on a second
server, play an
episode over HTTP, `eval run` — then the reference's three-forms pack is checked.

What differs from a person at a shell, and why: the family goes into a `pip --target`
folder on PYTHONPATH instead of the venv (the page's `in-test` marker), so the real
environment is never changed; the page's ports 8701/8702 become free ones; every data dir
is fresh under tmp_path; and PALAESTRA_PACKS_DIRS starts as an empty folder, so the
commands that run an embedded server skip the built-in packs (~10 s each; the page sets
it itself where it serves its own packs).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import cli_env, free_port
from docblocks import shell_script

pytestmark = pytest.mark.slow

PAGE = "writing-a-pack.md"
PAGE_DIR = "sums-walkthrough"  # the folder the page starts with
BIN = Path(sys.executable).parent


def walkthrough_script() -> str:
    script = shell_script(PAGE)
    for port in ("8701", "8702"):
        assert f"127.0.0.1:{port}" in script and f"--port {port}" in script
        script = script.replace(port, str(free_port()))
    return "set -euo pipefail\nset -x\n" + script


def stop_group(proc: subprocess.Popen[bytes]) -> None:
    """End whatever the script left running (its servers, when a step failed): SIGTERM, so
    they free their sandboxes, then SIGKILL."""
    for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 0.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


def test_the_walkthrough_runs_as_written(tmp_path: Path) -> None:
    site, empty = tmp_path / "site", tmp_path / "no-packs"
    empty.mkdir()
    env = cli_env(
        PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}",
        PYTHONPATH=str(site),
        DOC_SITE=str(site),
        PALAESTRA_PACKS_DIRS=str(empty),
        HOME=str(tmp_path / "home"),  # nothing of the user's ~/.config or default data dir
        PALAESTRA_CACHE=str(Path.home() / ".cache" / "palaestra"),  # shared images, read-only
    )
    started = time.monotonic()
    proc = subprocess.Popen(
        ["bash", "-c", walkthrough_script()],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # the servers it starts die with its group below
    )
    try:
        out, _ = proc.communicate(timeout=180)  # a hang guard
    finally:
        stop_group(proc)
    elapsed = time.monotonic() - started
    log = out.decode(errors="replace")
    assert proc.returncode == 0, log[-6000:]

    root = tmp_path / PAGE_DIR
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home", "no-packs", "site", PAGE_DIR]
    check = json.loads((root / "check.json").read_text())
    assert check["ok"] and check["tasks"] == 25, check["problems"]
    assert "reward 1.0 terminated True" in log
    report = json.loads((root / "runs" / "oracle" / "report.json").read_text())
    assert report["summary"]["mean_reward"] == 1.0, report["summary"]
    assert "acme/forms@0.1.0: 9/9 tasks checked" in log
    assert "acme/sums@0.1.0:sums-heldout-4" in log  # the folder served as it is
    assert (root / "build" / "sums" / "tasks.jsonl").exists()  # materialized
    generated = root / "server-b" / "packs" / "generated"  # installed: generated in sandboxes
    assert [p.name for p in generated.iterdir()], "pack install ran the generators in-process"
    # The figure issue 22 asks for (`pytest -s` shows it): ~30 s on an idle 2-core machine,
    # ~58 s at a load of 9; not asserted, so a busy machine does not fail the test.
    print(f"walkthrough: {elapsed:.1f} s")
