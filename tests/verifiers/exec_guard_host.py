"""Runs a command under the exec guard on this host, for tests/verifiers/test_exec_guard.py
(its own process: the tracer reaps every child of the process it runs in).

argv: CONFIG (JSON: hidden, workdir, tmp, own, argv, cwd; scratch optional). Prints
JSON: rc, confined, refused, stale.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from palaestra.verifiers.programs import exec_guard

PROGRAMS = Path(exec_guard.__file__).parent
SCRATCH = ["/tmp", "/var/tmp", "/dev/shm"]  # terminal_runner.SCRATCH


def main() -> None:
    cfg = json.loads(sys.argv[1])
    vdir, _logs, bindir, _home = cfg["hidden"]
    jail_source = (PROGRAMS / "agent_jail.py").read_text()
    jail = exec_guard.jail_argv(sys.executable, jail_source, cfg["hidden"], bindir, cfg["tmp"])
    scratch = cfg.get("scratch", SCRATCH)
    policy = exec_guard.Policy(cfg["own"], [cfg["workdir"], cfg["tmp"], *scratch], jail)
    tracer = exec_guard.Tracer(policy)
    env = {"PATH": os.environ["PATH"], "VERIFIER_DIR": vdir}
    rc = tracer.run(cfg["argv"], cfg["cwd"], env)
    # what the tracer still holds of processes that are gone (none may be left)
    stale = {p: s for p, s in tracer.state.items() if not os.path.exists(f"/proc/{p}")}
    report = {"rc": rc, "confined": tracer.confined, "refused": tracer.refused, "stale": stale}
    print(json.dumps(report))


if __name__ == "__main__":
    main()
