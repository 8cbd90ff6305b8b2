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
   (Harbor's convention); the harness turns it into its own exit status. The CTRF / JUnit
   reports the run wrote into that fresh logs folder give per-file test counts.

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
import json
import posixpath
import secrets
import shlex
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from palaestra.sandbox import ExecResult, Sandbox, SandboxError, programs
from palaestra.sandbox.base import BASE_PATH
from palaestra.verifiers.programs.terminal_runner import safe_path

VERSION = "2.0.0"
PROGRAMS = "palaestra.verifiers.programs"
# What the test-sh runner writes as its python3/pytest wrappers (programs/).
BOOT_PROGRAMS = (
    "python_wrapper.sh",
    "shell_wrapper.sh",
    "import_guard.py",
    "pytest_boot.py",
    "script_boot.py",
    "agent_jail.py",
    "uv_boot.py",
)
MAX_CHANNEL = 1024 * 1024
VERIFIER_DIR = "/tmp/verifier"
VERIFIER_LOGS = "/tmp/verifier-logs"
PYTEST_CONFIG_NAMES = ("conftest.py", "pytest.ini", "pyproject.toml", "setup.cfg", "tox.ini")
TEST_SH = "test.sh"
DEFAULT_TIMEOUT_S = 120.0

# The restore script's exit statuses.
PASS, FAIL = 0, 3
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
    # test file -> [passed, failed, total], from the CTRF / JUnit reports test.sh's run
    # wrote into the verifier's fresh logs folder (read by the runner after it ended)
    tests: dict[str, list[int]] = field(default_factory=dict)

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
        for name, (passed, failed, total) in sorted(self.tests.items()):
            out.update({f"{name}:passed": passed, f"{name}:failed": failed})
            out[f"{name}:total"] = total
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
        for name, (passed, failed, total) in sorted(self.tests.items()):
            lines.append(f"{name}: {passed}/{total} passed, {failed} failed")
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


def _tail(text: str, n: int = MAX_LOG) -> str:
    return text if len(text) <= n else "…" + text[-n:]


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
    path: str = BASE_PATH,
    reward_file: bool = False,
) -> TerminalRun:
    """Run the task's tests against `workspace` (a tar of the final workdir) in `box`,
    a fresh sandbox; raises SandboxError only for faults of ours (see the module doc)."""
    run = TerminalRun()
    # Tar work is CPU-bound (a workspace may be hundreds of MB): off the event loop.
    clean, links, notes = await asyncio.to_thread(sanitize_workspace, workspace)
    run.notes.extend(notes)
    await box.upload_tar(clean)
    if links:
        await box.exec(
            ["/bin/sh", "-c", _link_commands(workdir, links)],
            cwd=workdir,
            env=_exec_env(workdir, path),
        )
    sets = [("fail_to_pass", list(fail_to_pass)), ("pass_to_pass", list(pass_to_pass))]
    sets = [(name, ids) for name, ids in sets if ids]
    if sets:
        await _run_sets(box, run, workdir, verifier, environment, sets, timeout_s, path)
    if TEST_SH in verifier:
        await _run_test_sh(box, run, workdir, verifier, timeout_s, path, reward_file)
    if not sets and TEST_SH not in verifier:
        raise ValueError(
            "the task has neither verifier/test.sh nor fail_to_pass/pass_to_pass; "
            "it cannot be verified"
        )
    return run


def _runner_argv(mode: str) -> list[str]:
    return ["/usr/bin/env", "python3", "-I", "-c", _runner_source(), mode]


def _runner_source() -> str:
    return programs.text("terminal_runner.py", package=PROGRAMS)


def _exec_env(workdir: str, path: str) -> dict[str, str]:
    """What every verifier exec overrides of the sandbox's environment: a PATH without a
    workspace folder, a HOME outside it, no shell or Python startup variable."""
    return {
        "PATH": safe_path(workdir, path),
        "HOME": "/tmp",
        "BASH_ENV": "",
        "ENV": "",
        "PYTHONNOUSERSITE": "1",
        "PYTHONSTARTUP": "",
        "PYTHONPATH": "",
    }


def _channel(stdout: str, nonce: str) -> list[tuple[str, Any]]:
    """The runner's messages: only lines that start with this run's nonce."""
    out: list[tuple[str, Any]] = []
    prefix = nonce + " "
    for line in stdout.splitlines():
        if not line.startswith(prefix):
            continue
        kind, _, payload = line[len(prefix) :].partition(" ")
        try:
            out.append((kind, json.loads(payload)))
        except ValueError:
            continue
    return out


def _runner_stdin(nonce: str, cfg: Mapping[str, Any], tail: bytes = b"") -> bytes:
    return f"{nonce}\n{json.dumps(dict(cfg))}\n".encode() + tail


def _started(result: ExecResult, messages: list[tuple[str, Any]], what: str) -> None:
    """Raise SandboxError (void) when the runner never started or reported INFRA: ours."""
    infra = [data for kind, data in messages if kind == "INFRA"]
    if infra:
        raise SandboxError(f"the verifier could not run {what}: {infra[0]}")
    if not any(kind == "READY" for kind, _ in messages) and not result.timed_out:
        raise SandboxError(
            f"the verifier's runner for {what} did not start (exit {result.exit_code}; the "
            f"image needs python3): {_tail(result.stderr, 500)}"
        )


def judge_set(
    name: str, ids: Sequence[str], result: ExecResult, messages: list[tuple[str, Any]]
) -> TestSetResult:
    """A set's result from the runner's messages alone: every requested id matched by at
    least one collected test, each of those passed, the session ended, pytest exited 0."""
    entry = TestSetResult(name, list(ids), total=len(ids))
    collected: list[str] = []
    outcomes: dict[str, bool] = {}
    ended = exit_rc = None
    for kind, data in messages:
        if kind == "COLLECTED" and isinstance(data, list):
            collected = [str(x) for x in data]
        elif kind == "TEST" and isinstance(data, dict):
            node = str(data.get("id"))
            outcomes[node] = outcomes.get(node, True) and data.get("ok") is True
        elif kind == "END":
            ended = data
        elif kind == "EXIT":
            exit_rc = data
    for test_id in ids:
        nodes = [
            n for n in collected if n == test_id or n.startswith((test_id + "[", test_id + "::"))
        ]
        if nodes and all(outcomes.get(n) is True for n in nodes):
            entry.passed += 1
    complete = ended is not None and exit_rc == 0
    entry.ok = complete and not result.timed_out and entry.passed == len(ids)
    if result.timed_out:
        entry.note = "timed out"
    elif ended is None or exit_rc is None:
        entry.note = "the test session did not finish (a test killed or exited the runner?)"
    elif not entry.ok:
        summary = [ln for ln in result.stderr.splitlines() if ln.strip()][-3:]
        entry.note = f"pytest exit {exit_rc}: " + " | ".join(summary)[-300:]
    return entry


async def _run_sets(
    box: Sandbox,
    run: TerminalRun,
    workdir: str,
    verifier: Mapping[str, str],
    environment: Mapping[str, str],
    sets: list[tuple[str, list[str]]],
    timeout_s: float,
    path: str,
) -> None:
    restore = {
        rel: text
        for rel, text in environment.items()
        if posixpath.basename(rel) in PYTEST_CONFIG_NAMES
    }
    restore.update({rel: text for rel, text in verifier.items() if rel != TEST_SH})
    keep = sorted(rel for rel in restore if posixpath.basename(rel) in PYTEST_CONFIG_NAMES)
    env = _exec_env(workdir, path)
    result = await box.exec(
        ["/bin/bash", "-c", _restore_script(workdir, keep)],
        stdin=await asyncio.to_thread(files_tar, restore),
        cwd="/",
        env=env,
        timeout=60,
    )
    if result.exit_code >= INFRA:
        raise SandboxError(f"the verifier files could not be staged: {_tail(result.stderr, 500)}")
    if not result.ok:
        why = "timed out" if result.timed_out else f"exit {result.exit_code}"
        note = f"restoring the tests failed ({why}): {_tail(result.stderr, 500)}"
        run.sets = [TestSetResult(name, ids, note=note) for name, ids in sets]
        return
    # The verifier's ini alone configures pytest: the task's own root pytest.ini if it
    # shipped one, else an empty one (no rootdir search reaches the workspace's files).
    ini = restore.get("pytest.ini") or "[pytest]\n"
    for name, ids in sets:
        nonce = secrets.token_hex(16)
        res = await box.exec(
            _runner_argv("pytest"),
            stdin=_runner_stdin(nonce, {"workdir": workdir, "ids": ids, "ini": ini}),
            cwd=workdir,
            env=env,
            timeout=timeout_s,
            max_output=MAX_CHANNEL,
        )
        messages = _channel(res.stdout, nonce)
        _started(res, messages, f"the {name} tests")
        run.sets.append(judge_set(name, ids, res, messages))


def results_counts(results: object) -> dict[str, list[int]]:
    """Per test file [passed, failed, total] from the runner's `results` (CTRF reports
    first; a JUnit report adds only the files no CTRF report covered)."""
    out: dict[str, list[int]] = {}
    if not isinstance(results, dict):
        return out
    reports = [r for r in results.values() if isinstance(r, dict)]
    for kind in ("ctrf", "junit"):
        seen: dict[str, list[int]] = {}
        for report in (r for r in reports if r.get("format") == kind):
            files = report.get("files")
            for name, counts in files.items() if isinstance(files, dict) else ():
                ok = isinstance(counts, list) and len(counts) == 3
                if ok and all(isinstance(c, int) and c >= 0 for c in counts) and name not in out:
                    prev = seen.setdefault(str(name), [0, 0, 0])
                    seen[str(name)] = [a + b for a, b in zip(prev, counts, strict=True)]
        out.update(seen)
    return out


async def _run_test_sh(
    box: Sandbox,
    run: TerminalRun,
    workdir: str,
    verifier: Mapping[str, str],
    timeout_s: float,
    path: str,
    reward_file: bool,
) -> None:
    nonce = secrets.token_hex(16)
    cfg = {
        "workdir": workdir,
        "verifier_dir": VERIFIER_DIR,
        "logs": VERIFIER_LOGS,
        "reward_file": reward_file,
        "programs": {name: programs.text(name, package=PROGRAMS) for name in BOOT_PROGRAMS},
    }
    result = await box.exec(
        _runner_argv("test-sh"),
        stdin=_runner_stdin(nonce, cfg, await asyncio.to_thread(files_tar, verifier)),
        cwd="/",
        env=_exec_env(workdir, path),
        timeout=timeout_s,
        max_output=MAX_CHANNEL,
    )
    messages = _channel(result.stdout, nonce)
    _started(result, messages, "test.sh")
    log = _tail(result.stderr.strip(), 600)
    reports = [data for kind, data in messages if kind == "RESULT" and isinstance(data, dict)]
    if result.timed_out:
        run.script, run.script_note = 0.0, f"timed out after {timeout_s:g} s"
        return
    if not reports:
        run.script, run.script_note = 0.0, "the test harness was killed before it reported"
        return
    report = reports[-1]
    run.tests = results_counts(report.get("results"))
    rc, reward = report.get("rc"), report.get("reward")
    if reward_file and isinstance(reward, int | float):
        run.script, run.script_note = float(reward), "from reward.txt"
    elif reward_file and report.get("reward_note") not in (None, "", "no reward file"):
        run.script, run.script_note = 0.0, f"bad reward.txt: {report.get('reward_note')}"
    elif rc == 0:
        run.script, run.script_note = 1.0, "exit 0"
    else:
        note = report.get("note") or f"exit {rc}"
        run.script, run.script_note = 0.0, f"failed ({note}): {log}" if log else f"failed ({note})"
