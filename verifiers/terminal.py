"""Verifying a terminal task: tests staged after the agent ends, judged by exit codes.

`verify_workspace` takes a tar of the agent's final workspace (the agent's sandbox is
already closed, so none of its processes is left) and runs the task's tests in a *fresh*
sandbox made from it:

1. the workspace is unpacked into the fresh sandbox (symlinks that point outside it are
   recreated inside the sandbox, fifos and devices dropped and noted);
2. repository tasks (`fail_to_pass` / `pass_to_pass` pytest node ids): one exec restores
   the tests -- every verifier file but a top-level `test.sh` is copied over the workdir,
   the pytest configuration files (conftest.py, pytest.ini, pyproject.toml, setup.cfg,
   tox.ini) are reset to what the task shipped (others removed), bytecode caches deleted
   -- then one exec per set runs ``python3 -P -m pytest`` (``-P``: the workdir is not on
   sys.path before pytest is imported, so a planted ``pytest.py`` cannot stand in for it);
   a set passes only when pytest exits 0 *and* its JUnit report shows every test passed;
3. `test.sh` (when the task has one) runs in its own exec: the verifier files are unpacked
   from stdin into ``/tmp/verifier`` ($VERIFIER_DIR, a directory no agent process ever saw:
   a fresh sandbox's /tmp), then ``bash $VERIFIER_DIR/test.sh`` with cwd the workdir. Exit
   0 passes. A test may instead write a reward in [0, 1] to ``$VERIFIER_LOGS/reward.txt``
   (Harbor's convention); the harness turns it into its own exit status.

Nothing is read from text a test or the agent could print: each result is the exit status
of an exec as the sandbox backend reports it (the harness maps statuses so that a test's
own exit code cannot collide with an infrastructure code). A fault of *ours* (the
verifier files cannot be unpacked, the sandbox dies) raises `SandboxError`, which voids
the episode; anything the agent's final state causes (tests time out, a restore fails
because the agent made files unwritable) is a failure with reward 0.
"""

from __future__ import annotations

import asyncio
import io
import posixpath
import secrets
import shlex
import tarfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from xml.etree import ElementTree

from palaestra.sandbox import Sandbox, SandboxError

VERSION = "1.0.0"
VERIFIER_DIR = "/tmp/verifier"
VERIFIER_LOGS = "/tmp/verifier-logs"
PYTEST_CONFIG_NAMES = ("conftest.py", "pytest.ini", "pyproject.toml", "setup.cfg", "tox.ini")
TEST_SH = "test.sh"
PYTEST_ARGS = ("-q", "-p", "no:cacheprovider")
DEFAULT_TIMEOUT_S = 120.0

# Harness exit statuses (a test's own status is mapped to PASS or FAIL, never these).
PASS, FAIL, BAD_REWARD = 0, 3, 4
REWARD_BASE = 10  # 10 + round(100 * reward) for a reward file: 10..110
INFRA = 200  # >= 200: the harness itself failed (ours: void)
MAX_LOG = 4000


@dataclass
class TestSetResult:
    name: str
    ids: list[str]
    passed: int = 0
    total: int = 0
    ok: bool = False
    note: str = ""

    @property
    def fraction(self) -> float:
        if self.ok:
            return 1.0
        return self.passed / max(self.total, len(self.ids), 1)


@dataclass
class TerminalRun:
    """What the tests said about one final workspace."""

    sets: list[TestSetResult] = field(default_factory=list)
    script: float | None = None  # test.sh's reward, if the task has one
    script_note: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def reward(self) -> float:
        parts = [1.0 if all(s.ok for s in self.sets) else 0.0] if self.sets else []
        if self.script is not None:
            parts.append(self.script)
        return min(parts) if parts else 0.0

    @property
    def components(self) -> dict[str, float]:
        out = {s.name: s.fraction for s in self.sets}
        if self.script is not None:
            out["test_sh"] = self.script
        return out

    def feedback(self) -> str:
        lines = []
        for s in self.sets:
            state = "all passed" if s.ok else f"{s.passed}/{max(s.total, len(s.ids))} passed"
            lines.append(f"{s.name}: {state}" + (f" ({s.note})" if s.note else ""))
        if self.script is not None:
            lines.append(
                f"test.sh: reward {self.script:g}"
                + (f"; {self.script_note}" if self.script_note else "")
            )
        lines.extend(self.notes)
        return "\n".join(lines)


# -- the workspace copy ---------------------------------------------------------------------


def sanitize_workspace(data: bytes) -> tuple[bytes, list[tuple[str, str]], list[str]]:
    """A tar any backend's `upload_tar` takes: (tar, symlinks to recreate inside, notes).

    Directories, regular files and symlinks that stay inside are kept; a symlink that
    points elsewhere (absolute, or out through ..) is returned to be made with ``ln -s``
    in the sandbox; anything else (fifo, device, hard link) is dropped and noted."""
    out = io.BytesIO()
    links: list[tuple[str, str]] = []
    notes: list[str] = []
    with (
        tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as src,
        tarfile.open(fileobj=out, mode="w") as dst,
    ):
        for member in src:
            name = posixpath.normpath(member.name)
            if name in (".", "") or name.startswith("/") or name.split("/")[0] == "..":
                continue
            member.name = name
            if member.isdir():
                dst.addfile(member)
            elif member.isreg():
                dst.addfile(member, src.extractfile(member))
            elif member.issym():
                target = posixpath.normpath(
                    posixpath.join(posixpath.dirname(name), member.linkname)
                )
                if member.linkname.startswith("/") or target.split("/")[0] == "..":
                    links.append((name, member.linkname))
                else:
                    dst.addfile(member)
            else:
                notes.append(f"{name}: not a file, directory or symlink; not copied")
    return out.getvalue(), links, notes


def files_tar(files: Mapping[str, str], executable: bool = False) -> bytes:
    """A tar of text files (with their parent directories); scripts get mode 0755."""
    out = io.BytesIO()
    dirs: set[str] = set()
    with tarfile.open(fileobj=out, mode="w") as tf:
        for rel in sorted(files):
            parts = rel.split("/")
            for i in range(1, len(parts)):
                d = "/".join(parts[:i])
                if d not in dirs:
                    dirs.add(d)
                    info = tarfile.TarInfo(d)
                    info.type = tarfile.DIRTYPE
                    info.mode = 0o755
                    tf.addfile(info)
            raw = files[rel].encode("utf-8")
            info = tarfile.TarInfo(rel)
            info.size = len(raw)
            script = rel.endswith(".sh") or files[rel].startswith("#!")
            info.mode = 0o755 if (executable or script) else 0o644
            tf.addfile(info, io.BytesIO(raw))
    return out.getvalue()


def _link_commands(workdir: str, links: Sequence[tuple[str, str]]) -> str:
    return "".join(
        f"ln -sfn -- {shlex.quote(target)} {shlex.quote(posixpath.join(workdir, name))} "
        "2>/dev/null; "
        for name, target in links
    )


# -- the harness scripts --------------------------------------------------------------------


def _restore_script(workdir: str, keep: Sequence[str]) -> str:
    """Restore the tests and the pytest configuration the task shipped (stdin: their tar)."""
    w = shlex.quote(workdir)
    names = " -o ".join(f"-name {shlex.quote(n)}" for n in PYTEST_CONFIG_NAMES)
    keep_list = "\n".join(keep)
    return f"""\
set -u
R=$(mktemp -d /tmp/restore.XXXXXX) || exit {INFRA}
tar -x -C "$R" -f - || exit {INFRA + 1}
exec </dev/null
cd {w} || exit {FAIL}
chmod -R u+w . 2>/dev/null
find . \\( -name __pycache__ -o -name .pytest_cache \\) -prune -exec rm -rf {{}} + 2>/dev/null
find . -name '*.py[co]' -delete 2>/dev/null
cat >"$R.keep" <<'PALAESTRA_KEEP'
{keep_list}
PALAESTRA_KEEP
find . \\( {names} \\) -print | while IFS= read -r f; do
  grep -qxF -- "${{f#./}}" "$R.keep" || rm -rf -- "$f" || exit {FAIL}
done || exit {FAIL}
tar -c -C "$R" . | tar -x -C {w} --no-same-owner -f - || exit {FAIL}
exit {PASS}
"""


def _pytest_script(workdir: str, ids: Sequence[str], junit: str) -> str:
    """pytest on `ids`, imported before the workdir joins sys.path (a planted pytest.py or
    _pytest/ cannot stand in for it), then the workdir first, as ``python -m pytest`` has."""
    w = shlex.quote(workdir)
    args = [*PYTEST_ARGS, "--rootdir", workdir, "--junitxml", junit, "--", *ids]
    boot = (
        "import sys, pytest; "
        f"sys.path.insert(0, {workdir!r}); "
        f"raise SystemExit(pytest.main({args!r}))"
    )
    return f"""\
cd {w} || exit {FAIL}
PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 exec python3 -P -B -c {shlex.quote(boot)} </dev/null
"""


# test.sh's `python3 -m pytest`, `python -m pytest` and `pytest` import pytest before the
# cwd joins sys.path (as in the sets), so a pytest.py the agent planted cannot stand in.
_PYTEST_BOOT = (
    "import os, sys, pytest; sys.path.insert(0, os.getcwd()); sys.argv[0] = 'pytest'; "
    "raise SystemExit(pytest.console_main())"
)
_PYTEST_GUARD = f"""\
PY=$(command -v python3) || PY=
if [ -n "$PY" ]; then
  B=$(mktemp -d /tmp/verifier-bin.XXXXXX) || exit {INFRA}
  cat >"$B/python3" <<PALAESTRA_PY
#!/bin/sh
if [ "\\$1" = -m ] && [ "\\$2" = pytest ]; then
  shift 2
  exec "$PY" -P -c {shlex.quote(_PYTEST_BOOT)} "\\$@"
fi
exec "$PY" "\\$@"
PALAESTRA_PY
  printf '#!/bin/sh\\nexec "%s/python3" -m pytest "$@"\\n' "$B" >"$B/pytest"
  chmod 755 "$B/python3" "$B/pytest"
  ln -s python3 "$B/python"
  export PATH="$B:$PATH"
fi"""


def _test_sh_script(workdir: str) -> str:
    w = shlex.quote(workdir)
    return f"""\
set -u
V={VERIFIER_DIR}; L={VERIFIER_LOGS}
rm -rf "$V" "$L" 2>/dev/null
mkdir -p "$V" "$L" || exit {INFRA}
tar -x -C "$V" -f - || exit {INFRA + 1}
exec </dev/null
cd {w} || exit {FAIL}
{_PYTEST_GUARD}
bash "$V/{TEST_SH}"; rc=$?
if [ -f "$L/reward.txt" ]; then
  r=$(head -c 64 "$L/reward.txt" | tr -d ' \\t\\r\\n')
  case "$r" in
    1|1.0|1.00) exit {REWARD_BASE + 100};;
    0|0.0|0.00) exit {REWARD_BASE};;
    0.[0-9]|0.[0-9][0-9])
      v=${{r#0.}}; [ ${{#v}} -eq 1 ] && v=${{v}}0
      exit $(({REWARD_BASE} + 10#$v));;
    *) echo "palaestra: reward.txt holds '$r', not a number in [0, 1]" >&2; exit {BAD_REWARD};;
  esac
fi
[ "$rc" -eq 0 ] && exit {PASS}
exit {FAIL}
"""


def _tail(text: str, n: int = MAX_LOG) -> str:
    return text if len(text) <= n else "…" + text[-n:]


def _junit_counts(xml: bytes) -> tuple[int, int]:
    """(passed, total) from a pytest JUnit report."""
    root = ElementTree.fromstring(xml)
    total = passed = 0
    for case in root.iter("testcase"):
        total += 1
        if not any(child.tag in ("failure", "error", "skipped") for child in case):
            passed += 1
    return passed, total


# -- the verification -----------------------------------------------------------------------


async def verify_workspace(
    box: Sandbox,
    workspace: bytes,
    *,
    workdir: str,
    verifier: Mapping[str, str],
    environment: Mapping[str, str],
    fail_to_pass: Sequence[str] = (),
    pass_to_pass: Sequence[str] = (),
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> TerminalRun:
    """Run the task's tests against `workspace` (a tar of the final workdir) in `box`,
    a fresh sandbox; raises SandboxError only for faults of ours (see the module doc)."""
    run = TerminalRun()
    # Tar work is CPU-bound (a workspace may be hundreds of MB): off the event loop.
    clean, links, notes = await asyncio.to_thread(sanitize_workspace, workspace)
    run.notes.extend(notes)
    await box.upload_tar(clean)
    if links:
        await box.exec(["/bin/sh", "-c", _link_commands(workdir, links)], cwd=workdir)
    sets = [("fail_to_pass", list(fail_to_pass)), ("pass_to_pass", list(pass_to_pass))]
    sets = [(name, ids) for name, ids in sets if ids]
    if sets:
        await _run_sets(box, run, workdir, verifier, environment, sets, timeout_s)
    if TEST_SH in verifier:
        await _run_test_sh(box, run, workdir, verifier, timeout_s)
    if not sets and TEST_SH not in verifier:
        raise ValueError(
            "the task has neither verifier/test.sh nor fail_to_pass/pass_to_pass; "
            "it cannot be verified"
        )
    return run


async def _run_sets(
    box: Sandbox,
    run: TerminalRun,
    workdir: str,
    verifier: Mapping[str, str],
    environment: Mapping[str, str],
    sets: list[tuple[str, list[str]]],
    timeout_s: float,
) -> None:
    restore = {
        rel: text
        for rel, text in environment.items()
        if posixpath.basename(rel) in PYTEST_CONFIG_NAMES
    }
    restore.update({rel: text for rel, text in verifier.items() if rel != TEST_SH})
    keep = sorted(rel for rel in restore if posixpath.basename(rel) in PYTEST_CONFIG_NAMES)
    result = await box.exec(
        ["/bin/bash", "-c", _restore_script(workdir, keep)],
        stdin=await asyncio.to_thread(files_tar, restore),
        cwd="/",
        timeout=60,
    )
    if result.exit_code >= INFRA:
        raise SandboxError(f"the verifier files could not be staged: {_tail(result.stderr, 500)}")
    if not result.ok:
        why = "timed out" if result.timed_out else f"exit {result.exit_code}"
        note = f"restoring the tests failed ({why}): {_tail(result.stderr, 500)}"
        run.sets = [TestSetResult(name, ids, note=note) for name, ids in sets]
        return
    results = f".palaestra-junit-{secrets.token_hex(8)}"
    for name, ids in sets:
        junit = posixpath.join(workdir, results, f"{name}.xml")
        started = time.perf_counter()
        res = await box.exec(
            ["/bin/sh", "-c", _pytest_script(workdir, ids, junit)],
            cwd=workdir,
            timeout=timeout_s,
        )
        entry = TestSetResult(name, ids)
        try:
            entry.passed, entry.total = _junit_counts(await box.read_file(f"{results}/{name}.xml"))
        except (FileNotFoundError, ElementTree.ParseError, SandboxError):
            entry.passed, entry.total = 0, len(ids)
            entry.note = "no test report"
        entry.ok = (
            res.exit_code == 0
            and not res.timed_out
            and entry.total >= len(ids)
            and entry.passed == entry.total
        )
        if res.timed_out:
            entry.note = f"timed out after {time.perf_counter() - started:.0f} s"
        elif not entry.ok:
            summary = [ln for ln in res.stdout.splitlines() if ln.strip()][-3:]
            entry.note = (entry.note + " " if entry.note else "") + " | ".join(summary)[-300:]
        run.sets.append(entry)
    # Leave the workspace as the agent left it, apart from the restored tests.
    await box.exec(["rm", "-rf", "--", posixpath.join(workdir, results)], cwd="/")


async def _run_test_sh(
    box: Sandbox, run: TerminalRun, workdir: str, verifier: Mapping[str, str], timeout_s: float
) -> None:
    result = await box.exec(
        ["/bin/bash", "-c", _test_sh_script(workdir)],
        stdin=await asyncio.to_thread(files_tar, verifier),
        cwd="/",
        env={"VERIFIER_DIR": VERIFIER_DIR, "VERIFIER_LOGS": VERIFIER_LOGS, "WORKDIR": workdir},
        timeout=timeout_s,
    )
    rc = result.exit_code
    log = _tail((result.stdout + result.stderr).strip(), 600)
    if result.timed_out:
        run.script, run.script_note = 0.0, f"timed out after {timeout_s:g} s"
    elif rc >= INFRA:
        raise SandboxError(f"the verifier files could not be staged (exit {rc}): {log}")
    elif rc == PASS:
        run.script, run.script_note = 1.0, "exit 0"
    elif REWARD_BASE <= rc <= REWARD_BASE + 100:
        run.script, run.script_note = (rc - REWARD_BASE) / 100, "from reward.txt"
    elif rc == BAD_REWARD:
        run.script, run.script_note = 0.0, f"bad reward.txt: {log}"
    else:
        run.script, run.script_note = 0.0, f"failed: {log}" if log else "failed"
