"""Red-team tests of the exec guard (verifiers/programs/exec_guard.py) and agent_jail.py.

Each test plays the agent (it controls only the files of the workspace and what they do
when run) against an honest, ordinary checker, and asserts the SECURE behaviour: a test
that fails is an attack that works (or an honest program that the guard breaks).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from palaestra.verifiers.programs import exec_guard, terminal_runner
from palaestra.verifiers.programs.agent_jail import confine

HERE = Path(__file__).parent
PROGRAMS = Path(exec_guard.__file__).parent
PY = sys.executable


def _landlock() -> bool:
    probe = [PY, "-c", "from palaestra.verifiers.programs.agent_jail import "
             "confine; raise SystemExit(1 if confine([], []) else 0)"]  # fmt: skip
    return subprocess.run(probe, check=False).returncode == 0 and bool(confine)


pytestmark = pytest.mark.skipif(
    platform.machine() != "x86_64" or not _landlock(), reason="x86_64 with Landlock only"
)


class Box:
    """The tmp dirs of test_exec_guard.py's setup: verifier, logs, bin, home, work, agent-tmp."""

    def __init__(self, tmp: Path) -> None:
        self.vdir, self.logs, self.bindir, self.home = (
            tmp / n for n in ("verifier", "logs", "bin", "home")
        )
        self.work, self.agent_tmp = tmp / "work", tmp / "agent-tmp"
        for d in (self.vdir, self.logs, self.bindir, self.home, self.work, self.agent_tmp):
            d.mkdir(parents=True)
        (self.vdir / "expected.txt").write_text("SECRET\n")

    def wrappers(self) -> None:
        """The runner's real python3/bash/sh wrappers in bin (terminal_runner.write_wrappers)."""
        boot = {p.name: p.read_text() for p in PROGRAMS.iterdir() if p.is_file()}
        terminal_runner.write_wrappers(str(self.bindir), PY, os.environ["PATH"], boot)

    def agent(self, name: str, text: str, mode: int = 0o755) -> Path:
        path = self.work / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(mode)
        return path

    def run(self, checker: str, cwd: Path | None = None, timeout: float = 60) -> tuple[str, dict]:
        cfg = {
            "hidden": [str(self.vdir), str(self.logs), str(self.bindir), str(self.home)],
            "workdir": str(self.work),
            "tmp": str(self.agent_tmp),
            "own": [str(self.vdir), str(self.bindir), str(self.home)],
            "argv": [
                "/bin/bash",
                "-c",
                f"WORK={self.work}\nBIN={self.bindir}\nPY={PY}\n{checker}",
            ],
            "cwd": str(cwd or self.work),
        }
        out = subprocess.run(
            [PY, str(HERE / "exec_guard_host.py"), json.dumps(cfg)],
            capture_output=True, text=True, timeout=timeout, check=False,
        )  # fmt: skip
        assert out.returncode == 0, ("the tracer crashed", out.stdout[-2000:], out.stderr[-3000:])
        report = json.loads(out.stdout.splitlines()[-1])
        assert report["refused"] == "", report
        return out.stdout + out.stderr, report


@pytest.fixture
def box(tmp_path: Path) -> Box:
    return Box(tmp_path)


# --- 1. agent_jail.named_paths follows the agent's symlinks ------------------------------


def test_a_symlink_named_by_the_checkers_argument_does_not_open_the_verifier(box: Box) -> None:
    # The checker runs the agent's program with an ordinary argument (``./prog 42``); the
    # agent made ``/work/42`` a symlink into the (well-known) verifier folder.
    # named_paths() realpath()s every argument and grants what it lands on.
    (box.work / "42").symlink_to(box.vdir / "expected.txt")
    box.agent("prog", '#!/bin/sh\ncat "$1" 2>/dev/null || echo denied\n')
    out, _ = box.run('echo "got: $(./prog 42)"')
    assert "SECRET" not in out, out


def test_a_symlinked_folder_named_as_an_option_value_does_not_open_the_verifier(
    box: Box,
) -> None:
    # ``./prog --data=input``: the ``=`` value is named too; a symlink to the whole folder
    (box.work / "input").symlink_to(box.vdir)
    box.agent("prog", "#!/bin/sh\ncat input/expected.txt 2>/dev/null || echo denied\n")
    out, _ = box.run('echo "got: $(./prog --data=input)"')
    assert "SECRET" not in out, out


# --- 2. a shebang that names a runner wrapper --------------------------------------------


def test_a_shebang_naming_the_bash_wrapper_is_still_confined(box: Box) -> None:
    # ``#!<bin>/bash -e``: the kernel runs ``/bin/sh <bin>/bash -e ./prog``; is_wrapper()
    # is asked before confines() (and its AT_EXECFN check), the state becomes WRAPPER, the
    # wrapper sees ``-e`` (an option: "the checker's own") and execs the real bash on the
    # agent's script, an exec the tracer lets through unchecked. (The random bin folder's
    # name shows in /proc/*/cmdline of every ``python3``/``bash`` the checker runs.)
    box.wrappers()
    box.agent("prog", f'#!{box.bindir}/bash -e\ncat "$VERIFIER_DIR/expected.txt" || echo denied\n')
    out, _ = box.run('export PATH="$BIN:$PATH"\necho "got: $(./prog)"')
    assert "SECRET" not in out, out


def test_a_shebang_naming_the_python_wrapper_is_still_confined(box: Box) -> None:
    box.wrappers()
    box.agent(
        "prog.py",
        f"#!{box.bindir}/python3 -c\n"
        "import os\nprint(open(os.environ['VERIFIER_DIR'] + '/expected.txt').read())\n",
    )
    out, _ = box.run('export PATH="$BIN:$PATH"\necho "got: $(./prog.py 2>&1)"')
    assert "SECRET" not in out, out


# --- 3. checker commands whose agent code the guard does not see -------------------------


def test_an_agent_script_piped_into_bash_is_confined(box: Box) -> None:
    # ``bash < /work/solve.sh`` from outside the workspace: argv names no agent path
    box.agent("solve.sh", 'cat "$VERIFIER_DIR/expected.txt" 2>/dev/null || echo denied\n')
    out, _ = box.run('cd /\necho "got: $(bash < "$WORK/solve.sh")"', cwd=Path("/"))
    assert "SECRET" not in out, out


def test_an_agent_module_on_pythonpath_is_confined(box: Box) -> None:
    # ``PYTHONPATH=/work python3 -m solution`` from outside the workspace (real python)
    box.agent(
        "solution.py",
        "import os\ntry:\n print(open(os.environ['VERIFIER_DIR']+'/expected.txt').read())\n"
        "except OSError:\n print('denied')\n",
    )
    out, _ = box.run('cd /\necho "got: $(PYTHONPATH="$WORK" "$PY" -m solution)"', cwd=Path("/"))
    assert "SECRET" not in out, out


@pytest.mark.parametrize(
    "checker",
    [
        # a build of the agent's source into a folder of the checker's, then run there
        'mkdir -p /tmp/rt-build-$$ && gcc -o /tmp/rt-build-$$/a.out "$WORK/main.c" && '
        'cd /tmp/rt-build-$$ && echo "got: $(./a.out)"; rm -rf /tmp/rt-build-$$',
        # a copy of the agent's script run from a scratch folder
        'mkdir -p /tmp/rt-copy-$$ && cp "$WORK/solve.sh" /tmp/rt-copy-$$/ && '
        'cd /tmp/rt-copy-$$ && echo "got: $(./solve.sh)"; rm -rf /tmp/rt-copy-$$',
    ],
)
def test_the_agents_code_copied_or_built_outside_the_workspace_is_confined(
    box: Box, checker: str
) -> None:
    # confines() looks only at paths: a file derived from the agent's (gcc -o, cp, tar -x,
    # pip install) that lies outside the workspace is the checker's own
    (box.work / "main.c").write_text(
        '#include <stdio.h>\nint main(){char b[64]={0};FILE*f=fopen("'
        + str(box.vdir)
        + '/expected.txt","r");if(!f){puts("denied");return 0;}fgets(b,64,f);fputs(b,stdout);}\n'
    )
    box.agent("solve.sh", f"#!/bin/sh\n{_read(box)}\n")
    out, _ = box.run(checker)
    assert "SECRET" not in out, out


# (``/work/answer.txt -> /tmp/verifier/expected.txt`` read by the checker's own ``cat``:
# verify_workspace never recreates a link into the sandbox's scratch space;
# tests/adversarial/test_script_verifier.py::test_an_answer_linked_to_the_expected_output…)


# --- 4. ways the guard holds -------------------------------------------------------------

READ = 'cat "$VERIFIER_DIR/expected.txt" /tmp/verifier/expected.txt {v}/expected.txt 2>/dev/null'


def _read(box: Box) -> str:
    return READ.format(v=box.vdir) + " || echo denied"


@pytest.mark.parametrize(
    "checker",
    [
        'find "$WORK" -name prog -exec {} \\;',
        'echo "$WORK/prog" | xargs -n1 sh -c \'"$0"\'',
        'timeout 5 env -i "$WORK/prog"',
        'nice nohup stdbuf -o0 "$WORK/prog" 2>/dev/null; cat nohup.out 2>/dev/null',
        'cd /; ln -s "$WORK/prog" /tmp/$$.lnk 2>/dev/null; /tmp/$$.lnk; rm -f /tmp/$$.lnk',
        '"$PY" -c "import os,sys; os.execv(sys.argv[1], [\'fake-argv0\'])" "$WORK/prog"',
        '"$PY" -c "import os,sys; pid=os.posix_spawn(sys.argv[1],[sys.argv[1]],{}); '
        'os.waitpid(pid,0)" "$WORK/prog"',
        'bash -c "exec -a /usr/bin/cat $WORK/prog"',
        'tar -C "$WORK" -cf /dev/null . && git -C "$WORK" status >/dev/null 2>&1; "$WORK/prog"',
    ],
)
def test_plain_ways_of_running_the_agents_program_are_confined(box: Box, checker: str) -> None:
    box.agent("prog", f"#!/bin/sh\n{_read(box)}\n")
    out, _ = box.run(checker)
    assert "SECRET" not in out, out


def test_a_daemon_left_running_by_the_agent_stays_confined(box: Box) -> None:
    # the first run leaves a daemon that polls for the secret while the checker goes on
    box.agent(
        "prog",
        "#!/bin/sh\n( for i in $(seq 40); do "
        + READ.format(v=box.vdir)
        + f" >> {box.work}/leak.txt; sleep 0.05; done ) </dev/null >/dev/null 2>&1 &\necho ok\n",
    )
    out, _ = box.run('./prog; sleep 2.5; echo "got: $(cat leak.txt 2>/dev/null)"')
    assert "SECRET" not in out, out


def test_a_confined_program_cannot_signal_or_trace_the_checker(box: Box) -> None:
    box.agent(
        "prog",
        "#!/usr/bin/env python3\nimport os, signal\n"
        "try:\n os.kill(os.getppid(), signal.SIGSTOP); print('signalled')\n"
        "except OSError as e:\n print('kill refused', e.errno)\n"
        "try:\n open(f'/proc/{os.getppid()}/environ','rb').read(); print('environ read')\n"
        "except OSError as e:\n print('environ refused', e.errno)\n",
    )
    out, report = box.run('"$PY" "$WORK/prog" || true; echo "checker alive"')
    assert "signalled" not in out, out
    assert "checker alive" in out and report["rc"] == 0
    # (the checker's /proc/<pid>/environ: on this host as root it opens; in the sandboxes,
    # as their uid, it does not: tests/adversarial/test_script_verifier.py, read-the-checker)


# --- 5. the tracer's robustness ----------------------------------------------------------


def test_the_tracer_survives_a_fork_and_sigkill_storm(box: Box) -> None:
    # a process SIGKILLed while stopped at its fork event: PTRACE_GETEVENTMSG (unguarded in
    # Tracer.stopped) fails with ESRCH, which would crash the tracer
    box.agent(
        "storm.py",
        "import os, signal, time, threading\n"
        "end = time.time() + 2\n"
        "pids = []\n"
        "def killer():\n"
        "    while time.time() < end:\n"
        "        for p in list(pids[-64:]):\n"
        "            try: os.kill(p, signal.SIGKILL)\n"
        "            except OSError: pass\n"
        "threading.Thread(target=killer, daemon=True).start()\n"
        "while time.time() < end:\n"
        "    p = os.fork()\n"
        "    if p == 0:\n"
        "        pids.clear()\n"
        "        for _ in range(20):\n"
        "            q = os.fork()\n"
        "            if q == 0: os._exit(0)\n"
        "        os._exit(0)\n"
        "    pids.append(p)\n"
        "    for w in range(4):\n"
        "        try: os.waitpid(-1, os.WNOHANG)\n"
        "        except ChildProcessError: break\n"
        "print('storm done')\n",
    )
    out, report = box.run('"$PY" "$WORK/storm.py" >/dev/null 2>&1; echo "checker alive"')
    assert "checker alive" in out and report["rc"] == 0, out


def test_a_thread_that_execs_leaves_no_stale_confined_pid(box: Box) -> None:
    # a non-leader thread's execve: the kernel reports the exec under the leader's pid and
    # never reports the old tid's exit; Tracer.state keeps it CONFINED. Once the pid is
    # reused (pid_max is 32768 here), a checker process's first stop with that pid is not
    # held (``pid not in self.state`` is False) and its exec can be read as CONFINED.
    box.agent(
        "texec.py",
        "import os, threading, time\n"
        "def go():\n    os.execv('/bin/true', ['true'])\n"
        "for _ in range(3): threading.Thread(target=time.sleep, args=(5,), daemon=True).start()\n"
        "threading.Thread(target=go).start()\ntime.sleep(5)\n",
    )
    _, report = box.run(f'"{PY}" "{box.work}/texec.py"; true')
    assert report["stale"] == {}, report


# --- 6. honest programs still work -------------------------------------------------------


def test_an_honest_program_given_many_arguments_runs(box: Box) -> None:
    # ``./sum $(seq 12000)``: more than MAX_ARGV_BYTES // 8 pointers (minus the jail's own
    # ~9K argv) and the injection refuses, which kills the agent's correct program
    box.agent("sum", '#!/bin/sh\necho "count: $#"\n')
    out, _ = box.run("./sum $(seq 12000)")
    assert "count: 12000" in out, out[-2000:]


def test_an_honest_execute_only_binary_runs(box: Box) -> None:
    # a chmod 111 binary is not dumpable: PEEKDATA (and /proc/<pid>/exe, auxv) are refused
    # to a tracer without CAP_SYS_PTRACE, and the guard kills the agent's program
    (box.work / "hello.c").write_text('#include <stdio.h>\nint main(){puts("HELLO");return 0;}\n')
    out, _ = box.run('gcc -o hello hello.c && chmod 111 hello && echo "got: $(./hello)"')
    assert "got: HELLO" in out, out[-2000:]


def test_honest_programs_compile_thread_fork_and_use_tmp(box: Box) -> None:
    (box.work / "t.c").write_text(
        "#include <pthread.h>\n#include <stdio.h>\n#include <stdlib.h>\n#include <unistd.h>\n"
        "void*f(void*a){return a;}\n"
        "int main(){pthread_t t[8];for(int i=0;i<8;i++)pthread_create(&t[i],0,f,0);"
        "for(int i=0;i<8;i++)pthread_join(t[i],0);"
        'FILE*o=fopen(getenv("TMPDIR"),"r");if(o)fclose(o);'
        'if(vfork()==0){execl("/bin/echo","echo","CHILD",(char*)0);_exit(1);}'
        'system("echo SYS");puts("ANSWER 42");return 0;}\n'
    )
    (box.work / "Makefile").write_text("t: t.c\n\tgcc -O1 -pthread -o t t.c\n")
    box.agent(
        "p.py",
        "import subprocess, threading, tempfile\n"
        "r=[]\n"
        "ts=[threading.Thread(target=lambda: r.append(subprocess.run(['./t'],capture_output=True,"
        "text=True).stdout)) for _ in range(4)]\n"
        "[t.start() for t in ts]; [t.join() for t in ts]\n"
        "tempfile.NamedTemporaryFile().write(b'x')\n"
        "print('PY', sum('ANSWER 42' in x for x in r))\n",
    )
    out, report = box.run('make -s && ./t && "$PY" ./p.py')
    assert "ANSWER 42" in out and "CHILD" in out and "SYS" in out and "PY 4" in out, out
    assert report["rc"] == 0


def test_an_honest_program_writes_its_temporary_files_in_tmpdir(box: Box) -> None:
    # /tmp holds the hidden folders, so a confined program cannot create entries directly
    # in /tmp (a documented limit: docs/reference/verifiers.md); its TMPDIR is its own and works
    box.agent("w", '#!/bin/sh\necho x > "$TMPDIR/t-$$.txt" && echo "got: WROTE"\n')
    out, _ = box.run("./w")
    assert "got: WROTE" in out, out


def test_an_honest_build_tool_caches_in_its_own_tmpdir(box: Box) -> None:
    # the runner's XDG_CACHE_HOME lies in its HOME, hidden: `go test` in the workspace (its
    # build cache is $XDG_CACHE_HOME/go-build) failed with "permission denied"
    box.agent("c", '#!/bin/sh\nmkdir -p "$XDG_CACHE_HOME/tool" && echo "got: $XDG_CACHE_HOME"\n')
    out, _ = box.run(f"XDG_CACHE_HOME={box.home}/.cache ./c")
    assert f"got: {box.agent_tmp}/.cache" in out, out
    assert (box.agent_tmp / ".cache" / "tool").is_dir()
