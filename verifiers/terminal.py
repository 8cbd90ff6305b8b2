"""Verifying a terminal task: tests staged after the agent ends, judged by exit codes.

`verify_workspace` takes a tar of the agent's final workspace (the agent's sandbox is
already closed, so none of its processes is left) and runs the task's tests in a *fresh*
sandbox made from it:

1. the workspace is unpacked into the fresh sandbox (symlinks that point outside it are
   recreated inside the sandbox, fifos and devices dropped and noted);
2. repository tasks (`fail_to_pass` / `pass_to_pass` pytest node ids): one exec per set
   runs the runner's `pytest` mode (programs/repo_runner.py). Verification takes only the
   task's declared artifacts from the workspace: every verifier file but `test.sh`, the
   pytest configuration and what the environment shipped in a test folder are written
   over it; any other file in a test folder, configuration or startup file (conftest.py,
   *.ini, setup.cfg, pyproject.toml, sitecustomize, .pth, *.dist-info) and all bytecode is
   removed. pytest, its plugins and the standard library it uses are loaded before the
   workspace joins the end of sys.path, behind a guard that loads no standard-library or
   tooling name from it. One forked child per test file runs the tests; the agent's code
   they import runs in a worker process of the child's, reached through proxies (plain
   data crosses back, the child is non-dumpable). The parent writes the channel and counts
   a test only from a child that reached its end with pytest untampered; asserts compare
   strictly (an always-equal object fails);
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
import os
import posixpath
import secrets
import shlex
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from palaestra.sandbox import ExecResult, Sandbox, SandboxError, programs
from palaestra.sandbox.base import (
    BASE_PATH,
    forget_members,
    spool_file,
    tar_members,
    tar_writer,
)
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
    "exec_guard.py",
    "uv_boot.py",
    "repo_wire.py",
    "repo_strict.py",
    "repo_proxy.py",
    "repo_worker.py",
)
# What repo_runner.py writes for its worker (repo_proxy.py), in its HELPERS order.
REPO_HELPERS = (
    "repo_wire.py",
    "repo_strict.py",
    "repo_proxy.py",
    "repo_worker.py",
    "agent_jail.py",
    "exec_guard.py",
)
MAX_CHANNEL = 1024 * 1024
MAX_NOTES = 100  # notes on members not copied, then one line that counts the rest
VERIFIER_DIR = "/tmp/verifier"
VERIFIER_LOGS = "/tmp/verifier-logs"
# The folder of VERIFIER_DIR a task's test-time installs come in (envs/terminal/testinstall.py)
VERIFIER_SITE = ".palaestra-site"
# Where the verification sandbox keeps what the agent must not reach (VERIFIER_DIR, the
# logs, the runner's wrappers and HOME) and the kernel's views of processes.
VERIFIER_SPACE = ("/tmp", "/var/tmp", "/dev/shm", "/proc")
PYTEST_CONFIG_NAMES = ("conftest.py", "pytest.ini", "pyproject.toml", "setup.cfg", "tox.ini")
TEST_SH = "test.sh"
DEFAULT_TIMEOUT_S = 120.0

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


def sanitize_workspace(src: BinaryIO, dst: BinaryIO) -> tuple[list[tuple[str, str]], list[str]]:
    """Copy the tar in `src` to `dst` as one any backend's `upload_tar` takes, a member at a
    time (a workspace may be gigabytes; none of it is held whole): (symlinks to recreate
    inside, notes).

    Directories, regular files and symlinks that stay inside are kept; a symlink that
    points elsewhere (absolute, or out through ..) is returned to be made with ``ln -s``
    in the sandbox; anything else (fifo, device, hard link) is dropped and noted."""
    links: list[tuple[str, str]] = []
    notes: list[str] = []
    dropped = 0
    src.seek(0)
    with (
        tarfile.open(fileobj=src, mode="r:*") as tin,
        tar_writer(dst) as tout,
    ):
        for member in tar_members(tin):
            name = posixpath.normpath(member.name)
            if name in (".", "") or name.startswith("/") or name.split("/")[0] == "..":
                continue
            member.name = name
            if member.isdir():
                tout.addfile(member)
            elif member.isreg():
                tout.addfile(member, tin.extractfile(member))
            elif member.issym():
                target = posixpath.normpath(
                    posixpath.join(posixpath.dirname(name), member.linkname)
                )
                if member.linkname.startswith("/") or target.split("/")[0] == "..":
                    links.append((name, member.linkname))
                else:
                    tout.addfile(member)
            elif len(notes) < MAX_NOTES:
                notes.append(f"{name}: not a file, directory or symlink; not copied")
            else:
                dropped += 1
            forget_members(tout)
    if dropped:
        notes.append(f"... and {dropped} more not a file, directory or symlink; not copied")
    return links, notes


def files_tar(
    files: Mapping[str, str], executable: bool = False, blobs: Mapping[str, Path] | None = None
) -> bytes:
    """A tar of text files and the binary files in `blobs` (relative path -> the file with
    its bytes, server/packs/blobs.py), with their parent directories; scripts and ELF
    programs get mode 0755."""
    out = io.BytesIO()
    write_files_tar(out, files, executable, blobs)
    return out.getvalue()


def write_files_tar(
    out: BinaryIO,
    files: Mapping[str, str],
    executable: bool = False,
    blobs: Mapping[str, Path] | None = None,
) -> None:
    """`files_tar` into `out`, a blob at a time from its file (never all in memory)."""
    dirs: set[str] = set()
    binary = dict(blobs or {})
    with tarfile.open(fileobj=out, mode="w") as tf:
        for rel in sorted({*files, *binary}):
            parts = rel.split("/")
            for i in range(1, len(parts)):
                d = "/".join(parts[:i])
                if d not in dirs:
                    dirs.add(d)
                    info = tarfile.TarInfo(d)
                    info.type = tarfile.DIRTYPE
                    info.mode = 0o755
                    tf.addfile(info)
            info = tarfile.TarInfo(rel)
            if rel in files:
                raw = files[rel].encode("utf-8")
                data: BinaryIO = io.BytesIO(raw)
                info.size = len(raw)
            else:
                data = binary[rel].open("rb")
                info.size = os.fstat(data.fileno()).st_size
                raw = data.read(4)
                data.seek(0)
            script = rel.endswith(".sh") or raw.startswith((b"#!", b"\x7fELF"))
            info.mode = 0o755 if (executable or script) else 0o644
            with data:
                tf.addfile(info, data)


def _links_outside_the_verifier(
    workdir: str, links: list[tuple[str, str]]
) -> tuple[list[tuple[str, str]], list[str]]:
    """(the links to recreate, the names of those dropped): a link of the agent's into
    the verification sandbox's scratch space (the verifier's files, logs and wrappers live
    in its /tmp) would make the checker read its own expected output as the answer."""
    keep, dropped = [], []
    for name, target in links:
        where = posixpath.normpath(posixpath.join(workdir, posixpath.dirname(name), target))
        if any(where == d or where.startswith(d + "/") for d in VERIFIER_SPACE):
            dropped.append(name)
        else:
            keep.append((name, target))
    return keep, dropped


def _link_commands(workdir: str, links: Sequence[tuple[str, str]]) -> str:
    return "".join(
        f"ln -sfn -- {shlex.quote(target)} {shlex.quote(posixpath.join(workdir, name))} "
        "2>/dev/null; "
        for name, target in links
    )


# -- the harness scripts --------------------------------------------------------------------


def _tail(text: str, n: int = MAX_LOG) -> str:
    return text if len(text) <= n else "…" + text[-n:]


# -- the verification -----------------------------------------------------------------------


async def verify_workspace(
    box: Sandbox,
    workspace: bytes | BinaryIO,
    *,
    workdir: str,
    verifier: Mapping[str, str],
    environment: Mapping[str, str],
    fail_to_pass: Sequence[str] = (),
    pass_to_pass: Sequence[str] = (),
    timeout_s: float = DEFAULT_TIMEOUT_S,
    path: str = BASE_PATH,
    reward_file: bool = False,
    spool: Path | None = None,
    verifier_blobs: Mapping[str, Path] | None = None,
    site: bytes = b"",
) -> TerminalRun:
    """Run the task's tests against `workspace` (a tar of the final workdir: bytes, or a
    seekable file such as `Sandbox.download_tar_to` fills) in `box`, a fresh sandbox;
    raises SandboxError only for faults of ours (see the module doc). The cleaned copy of
    the workspace waits in an anonymous file in `spool` (the server's tmp dir; None: in
    memory, for a small tar), so a big workspace never sits whole in server memory.
    `verifier_blobs`: the verifier's binary files (path -> the file with their bytes),
    staged with its text files for test.sh; `site`: a tar of its test-time installs, staged
    after them (the runner reads both)."""
    run = TerminalRun()
    src = io.BytesIO(workspace) if isinstance(workspace, bytes) else workspace
    with spool_file(spool) if spool is not None else io.BytesIO() as clean:
        # Tar work is CPU-bound (a workspace may be hundreds of MB): off the event loop.
        links, notes = await asyncio.to_thread(sanitize_workspace, src, clean)
        run.notes.extend(notes)
        links, dropped = _links_outside_the_verifier(workdir, links)
        run.notes.extend(
            f"{name}: a link into the verifier's scratch space; not copied" for name in dropped
        )
        await box.upload_tar_from(clean)
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
        staged = await asyncio.to_thread(files_tar, verifier, False, verifier_blobs) + site
        await _run_test_sh(box, run, workdir, staged, timeout_s, path, reward_file)
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
    least one collected test, each of those passed in a test process that reached its
    end untampered (no FILE problem), and the runner itself finished."""
    entry = TestSetResult(name, list(ids), total=len(ids))
    collected: list[str] = []
    outcomes: dict[str, bool] = {}
    problems: list[str] = []
    ended = exit_rc = None
    for kind, data in messages:
        if kind == "COLLECTED" and isinstance(data, list):
            collected += [str(x) for x in data]
        elif kind == "TEST" and isinstance(data, dict):
            node = str(data.get("id"))
            outcomes[node] = outcomes.get(node, True) and data.get("ok") is True
        elif kind == "FILE" and isinstance(data, dict) and data.get("note"):
            problems.append(f"{data.get('file')}: {data.get('note')}")
        elif kind == "RESTORE":
            problems.append(str(data))
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
    entry.ok = complete and not problems and not result.timed_out and entry.passed == len(ids)
    if result.timed_out:
        entry.note = "timed out"
    elif problems:
        entry.note = "; ".join(problems)[:600]
    elif ended is None or exit_rc is None:
        entry.note = "the test session did not finish (a test killed or exited the runner?)"
    elif not entry.ok:
        summary = [ln for ln in result.stderr.splitlines() if ln.strip()][-3:]
        entry.note = " | ".join(summary)[-300:]
    return entry


def declared_tests(
    verifier: Mapping[str, str], environment: Mapping[str, str]
) -> tuple[dict[str, str], list[str]]:
    """What verification takes from the pack rather than from the agent: (files to write
    over the workspace, the test folders in which nothing else may stay).

    The verifier's files (but test.sh), the pytest configuration the environment shipped,
    and whatever the environment shipped inside a test folder (a folder of a verifier
    file, other than the workdir itself, whose name starts with "test")."""
    files = {rel: text for rel, text in verifier.items() if rel != TEST_SH}
    test_dirs = sorted(
        {
            posixpath.dirname(rel)
            for rel in files
            if posixpath.basename(posixpath.dirname(rel)).startswith("test")
        }
    )
    for rel, text in environment.items():
        config = posixpath.basename(rel) in PYTEST_CONFIG_NAMES
        if config or any(rel.startswith(d + "/") for d in test_dirs):
            files.setdefault(rel, text)
    return files, test_dirs


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
    files, test_dirs = declared_tests(verifier, environment)
    # The verifier's ini alone configures pytest: the task's own root pytest.ini if it
    # shipped one, else an empty one (no rootdir search reaches the workspace's files).
    cfg = {
        "workdir": workdir,
        "files": files,
        "test_dirs": test_dirs,
        "ini": files.get("pytest.ini") or "[pytest]\n",
        # the task's own top-level names may load from the workspace even where they are
        # also a standard-library name (a repository's `test/` package)
        "allowed": sorted({r.split("/")[0].removesuffix(".py") for r in (*environment, *files)}),
        "program": programs.text("repo_runner.py", package=PROGRAMS),
        # the code under test runs in a worker process these start (repo_proxy.py)
        "helpers": {name: programs.text(name, package=PROGRAMS) for name in REPO_HELPERS},
        "call_timeout_s": max(5.0, timeout_s / 4),
    }
    env = _exec_env(workdir, path)
    for name, ids in sets:
        nonce = secrets.token_hex(16)
        res = await box.exec(
            _runner_argv("pytest"),
            stdin=_runner_stdin(nonce, {**cfg, "ids": ids}),
            cwd=workdir,
            env=env,
            timeout=timeout_s,
            max_output=MAX_CHANNEL,
        )
        messages = _channel(res.stdout, nonce)
        _started(res, messages, f"the {name} tests")
        entry = judge_set(name, ids, res, messages)
        run.sets.append(entry)
        if name == sets[0][0]:
            run.notes.extend(_workspace_notes(messages))


def _workspace_notes(messages: list[tuple[str, Any]]) -> list[str]:
    """What the runner did not take from the workspace (it may be what a cheat tried)."""
    notes = []
    for kind, data in messages:
        names = ", ".join(str(x) for x in data) if isinstance(data, list) else ""
        if kind == "REMOVED" and names:
            notes.append(f"not the task's, removed before the tests: {names}")
        elif kind == "SHADOW" and names:
            notes.append(
                "workspace files named like standard-library or test-tooling modules, "
                f"never loaded: {names}"
            )
    return notes


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
    staged: bytes,
    timeout_s: float,
    path: str,
    reward_file: bool,
) -> None:
    """test.sh's run, the verifier's files (`staged`, a tar) unpacked into VERIFIER_DIR."""
    nonce = secrets.token_hex(16)
    cfg = {
        "workdir": workdir,
        "verifier_dir": VERIFIER_DIR,
        "logs": VERIFIER_LOGS,
        "reward_file": reward_file,
        "call_timeout_s": timeout_s,  # one call of the agent's code a test makes (worker)
        "site": posixpath.join(VERIFIER_DIR, VERIFIER_SITE),  # the test-time installs, if any
        "programs": {name: programs.text(name, package=PROGRAMS) for name in BOOT_PROGRAMS},
    }
    result = await box.exec(
        _runner_argv("test-sh"),
        stdin=_runner_stdin(nonce, cfg, staged),
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
    if report.get("guard"):
        run.notes.append(f"exec guard off ({report['guard']}): only the wrappers confine")
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
