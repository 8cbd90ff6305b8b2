"""The terminal runner's exec guard (verifiers/programs/exec_guard.py): every program of the
agent's that the checker starts runs under Landlock, however it is started (issue 31,
invariant 3: "including when the checker runs the agent's program").

- `confines`: which execs of the checker's are the agent's (its files, a tool run on its
  folder or in it) and which stay the checker's own (its scripts, inline code, plain tools);
- on this host, a checker that executes the agent's script directly, by a relative path,
  from a Python ``subprocess``, through ``make`` or ``env``, gets a program that cannot read
  the verifier's folder, while the checker itself still reads it; a file the command names
  stays readable; a confined program's children need no second jail.

The same attacks through a real verification (bwrap, docker) are in
tests/adversarial/test_script_verifier.py.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from palaestra.verifiers.programs.agent_jail import confine
from palaestra.verifiers.programs.exec_guard import Policy, Started, confines

HERE = Path(__file__).parent
OWN = ["/tmp/verifier", "/tmp/bin", "/tmp/home", "/opt/palaestra-verifier"]
SCRATCH = ["/tmp", "/var/tmp", "/dev/shm"]
POLICY = Policy([*OWN, "/tmp/verifier-logs"], ["/work", "/tmp/agent-tmp", *SCRATCH], [])


@pytest.mark.parametrize(
    ("exe", "argv", "cwd", "agent"),
    [
        ("/work/prog", ["/work/prog"], "/", True),
        ("/work/sub/a.out", ["./a.out"], "/work/sub", True),
        ("/usr/bin/make", ["make"], "/work", True),
        ("/usr/bin/make", ["make", "-C", "/work"], "/", True),
        ("/usr/bin/gcc", ["gcc", "-I/work/inc", "main.c"], "/tmp/x", True),
        ("/usr/bin/node", ["node", "--out=/work/o"], "/", True),
        ("/usr/bin/bash", ["bash", "/work/run.sh"], "/", True),
        ("/usr/bin/python3.11", ["python3", "/work/x.py"], "/", True),
        ("/usr/bin/python3.11", ["python3", "-m", "pkg"], "/work", True),
        ("/usr/bin/cat", ["cat", "/work/out"], "/work", False),
        ("/usr/bin/cp", ["cp", "/work/out", "/tmp/verifier-logs/x"], "/work", False),
        ("/usr/bin/dash", ["sh", "-c", "make"], "/work", False),
        ("/usr/bin/bash", ["bash", "-ec", "make"], "/work", False),
        ("/usr/bin/bash", ["bash", "/tmp/verifier/test.sh"], "/work", False),
        ("/usr/bin/python3.11", ["python3", "-I", "-B", "-c", "code"], "/work", False),
        ("/usr/bin/node", ["node", "/tmp/verifier/t.js", "/work"], "/work", False),
        ("/tmp/verifier/checker", ["./checker", "/work/out"], "/tmp/verifier", False),
        ("/opt/palaestra-verifier/bin/uv", ["uv", "run", "pytest"], "/work", False),
        ("/usr/bin/apt-get", ["apt-get", "update"], "/", False),
        ("/usr/bin/make", ["make", "-C", "/application"], "/", False),
    ],
)
def test_which_execs_are_the_agents(exe: str, argv: list[str], cwd: str, agent: bool) -> None:
    assert confines(Started(exe, argv, cwd), POLICY) is agent


def test_a_script_of_the_agents_is_confined_whatever_its_interpreter() -> None:
    # ``#!/usr/bin/env -S cat /tmp/verifier/expected.txt``: the kernel runs env (a plain
    # tool) with the script's path; the exec named the agent's file
    argv = ["/usr/bin/env", "-S cat /tmp/verifier/expected.txt", "./prog"]
    assert confines(Started("/usr/bin/env", argv, "/work", execfn="./prog"), POLICY)
    venv = Started("/usr/bin/python3.11", ["python", "-c", "x"], "/", "/work/venv/bin/python")
    assert confines(venv, POLICY)
    own = Started("/usr/bin/bash", ["bash", "/tmp/verifier/t.sh"], "/", "/bin/bash")
    assert not confines(own, POLICY)


def test_the_agents_code_that_no_path_of_the_command_names_is_confined() -> None:
    # a script on stdin, a module on PYTHONPATH, a program built or copied outside the
    # workspace (anything under the sandbox's scratch folders but the runner's own)
    assert confines(Started("/usr/bin/bash", ["bash"], "/", stdin="/work/solve.sh"), POLICY)
    on_path = Started(
        "/usr/bin/python3.11", ["python3", "-m", "sol"], "/", env={"PYTHONPATH": "/work"}
    )
    assert confines(on_path, POLICY)
    assert confines(Started("/tmp/b/a.out", ["./a.out"], "/tmp/b"), POLICY)
    assert confines(Started("/usr/bin/dash", ["sh", "x.sh"], "/", execfn="/tmp/link"), POLICY)
    assert not confines(Started("/tmp/home/.local/bin/tool", ["tool"], "/work"), POLICY)
    assert not confines(Started("/usr/bin/bash", ["bash"], "/", stdin="/tmp/verifier/s.sh"), POLICY)
    plain = Started("/usr/bin/python3.11", ["python3", "-m", "x"], "/", env={"WORKDIR": "/work"})
    assert not confines(plain, POLICY)


def _landlock() -> bool:
    probe = [sys.executable, "-c", "from palaestra.verifiers.programs.agent_jail import "
             "confine; raise SystemExit(1 if confine([], []) else 0)"]  # fmt: skip
    return subprocess.run(probe, check=False).returncode == 0 and bool(confine)


NEEDS = pytest.mark.skipif(
    platform.machine() != "x86_64" or not _landlock(), reason="x86_64 with Landlock only"
)
# the checker's Python runs the agent's program (a test's subprocess.run: vfork and exec)
RUN_PY = (
    "import subprocess, sys\n"
    "print(subprocess.run(sys.argv[1:], capture_output=True, text=True).stdout.strip())\n"
)
CHECKER = """\
cd "$WORK"
chmod +x prog sub/prog2 sub/envs
echo "direct: $(/bin/sh -c "$WORK/prog")"
echo "relative: $(./prog)"
echo "python: $(python3 "$VERIFIER_DIR/run.py" "$WORK/prog")"
make -s -C "$WORK" >/dev/null 2>&1; echo "make: $(cat "$WORK/made.txt")"
echo "env: $(env ./prog)"
echo "named: $(./sub/prog2 "$VERIFIER_DIR/named.txt")"
echo "child: $(./sub/prog2)"
echo "shebang: $(./sub/envs 2>/dev/null | grep -c SECRET)"
echo "checker: $(cat "$VERIFIER_DIR/expected.txt")"
"""


@NEEDS
def test_the_checkers_programs_of_the_agent_cannot_read_the_verifier(tmp_path: Path) -> None:
    vdir, logs, bindir, home = (tmp_path / n for n in ("verifier", "logs", "bin", "home"))
    work, agent_tmp = tmp_path / "work", tmp_path / "agent-tmp"
    for d in (vdir, logs, bindir, home, work / "sub", agent_tmp):
        d.mkdir(parents=True)
    (vdir / "expected.txt").write_text("SECRET\n")
    (vdir / "named.txt").write_text("NAMED\n")
    (vdir / "run.py").write_text(RUN_PY)
    read = f"cat {vdir}/expected.txt 2>/dev/null || echo denied\n"
    (work / "prog").write_text("#!/bin/sh\n" + read)
    # a confined program's child: reads what its parent was handed, never the rest
    (work / "sub" / "prog2").write_text(
        f'#!/bin/sh\n[ -n "$1" ] && cat "$1" && exit\nsh -c \'{read.strip()}\'\n'
    )
    (work / "sub" / "envs").write_text(f"#!/usr/bin/env -S cat {vdir}/expected.txt\n")
    (work / "Makefile").write_text(f"all:\n\t{read.strip()} > made.txt\n")
    cfg = {
        "hidden": [str(vdir), str(logs), str(bindir), str(home)],
        "workdir": str(work),
        "tmp": str(agent_tmp),
        "own": [str(vdir), str(logs), str(bindir), str(home)],
        "argv": ["/bin/bash", "-c", f"WORK={work}\n{CHECKER}"],
        "cwd": str(work),
    }
    out = subprocess.run(
        [sys.executable, str(HERE / "exec_guard_host.py"), json.dumps(cfg)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    lines = dict(line.split(": ", 1) for line in out.stdout.splitlines() if ": " in line)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.splitlines()[-1])
    assert report["refused"] == "" and report["rc"] == 0, report
    for how in ("direct", "relative", "python", "make", "env", "child"):
        assert lines[how] == "denied", (how, out.stdout, out.stderr)
    assert lines["named"] == "NAMED"
    assert lines["shebang"] == "0"
    assert lines["checker"] == "SECRET"
    assert report["confined"] >= 7
