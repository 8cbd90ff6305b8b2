"""What the terminal verifier's exec guard costs a checker (verifiers/programs/exec_guard.py).

On this host (no sandbox), a checker script starts N plain tools (`true`, `cat`: traced,
never jailed), N programs of the agent's (a workspace script: each jailed at its exec),
and one Python that forks N times (fork events only). Each runs once under the guard and
once untraced, in this process; the script prints both times and their ratio.

    .venv/bin/python bench/exec_guard.py            # N = 100
    .venv/bin/python bench/exec_guard.py --n 300
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from palaestra.verifiers.programs import exec_guard

PROGRAMS = Path(exec_guard.__file__).parent
CHECKS = {
    "plain tools": "for i in $(seq {n}); do true; cat /dev/null; done\n",
    "agent's programs": 'for i in $(seq {n}); do "$WORK/prog" >/dev/null; done\n',
    "python forks": "python3 -c 'import os\nfor _ in range({n}):\n"
    "    pid = os.fork()\n    os._exit(0) if pid == 0 else os.waitpid(pid, 0)'\n",
}


def _tracer(root: Path) -> exec_guard.Tracer:
    hidden = [str(root / n) for n in ("verifier", "logs", "bin", "home")]
    jail_source = (PROGRAMS / "agent_jail.py").read_text()
    jail = exec_guard.jail_argv(sys.executable, jail_source, hidden, hidden[2], str(root / "t"))
    policy = exec_guard.Policy(hidden, [str(root / "work")], jail)
    return exec_guard.Tracer(policy)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100)
    args = parser.parse_args()
    if why := exec_guard.available():
        raise SystemExit(f"the exec guard cannot run here: {why}")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for name in ("verifier", "logs", "bin", "home", "work", "t"):
            (root / name).mkdir()
        prog = root / "work" / "prog"
        prog.write_text("#!/bin/sh\necho hi\n")
        prog.chmod(0o755)
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "WORK": str(root / "work")}
        print(f"{'check':<18} {'untraced s':>10} {'guarded s':>10} {'ratio':>7}")
        for name, template in CHECKS.items():
            argv = ["/bin/bash", "-c", template.format(n=args.n)]
            start = time.perf_counter()
            subprocess.run(argv, cwd=root / "work", env=env, check=True)
            plain = time.perf_counter() - start
            tracer = _tracer(root)
            start = time.perf_counter()
            rc = tracer.run(argv, str(root / "work"), env)
            guarded = time.perf_counter() - start
            assert rc == 0 and not tracer.refused, (rc, tracer.refused)
            print(f"{name:<18} {plain:>10.3f} {guarded:>10.3f} {guarded / plain:>7.2f}")


if __name__ == "__main__":
    main()
