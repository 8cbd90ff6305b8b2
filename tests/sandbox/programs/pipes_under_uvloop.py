"""Drive the sandbox pipes the server serves on its event loop (the Python fork server's
output pipes, a bwrap shell's control and status pipes) under uvloop, as uvicorn runs the
server.  Run under ``strace -Z -e trace=close`` (main thread only): a pipe closed twice
shows as a close() that fails with EBADF (tests/sandbox/test_fdpipes.py)."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import uvloop

from palaestra.sandbox.base import SandboxSpec
from palaestra.sandbox.bwrap import BwrapBackend
from palaestra.sandbox.forkrun import PythonRun
from palaestra.sandbox.forkserver import PythonForkServer

BIG = 3 << 20  # over twice a stream's limit: reading pauses and resumes


async def main(runtime: Path | None) -> None:
    fork_server = PythonForkServer()
    await fork_server.start()
    try:
        for _ in range(3):
            code = f"import sys; sys.stdout.write('x' * {BIG}); print('e', file=sys.stderr)"
            result = await fork_server.run(PythonRun(code, {}, b"", 30.0, BIG + 10, 256, 4))
            assert (result.exit_code, len(result.stdout), result.stderr) == (0, BIG, "e\n")
    finally:
        await fork_server.aclose()
    backend = BwrapBackend(runtime)
    try:
        async with await backend.create(SandboxSpec(workspace_mb=16)) as box:
            session = await box.shell()
            try:
                for n in range(3):
                    r = await session.run(f"echo {n}; head -c {BIG} /dev/zero | wc -c")
                    assert (r.output, r.exit_code) == (f"{n}\n{BIG}\n", 0), r
                r = await session.run("exit 3")  # the shell exits: its pipes close, once
                assert r.restarted or r.exit_code == 3, r
            finally:
                await session.close()
    finally:
        await backend.aclose()
    print("ok", flush=True)


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        uvloop.run(main(None if sys.argv[1:] == ["root"] else Path(tmp) / "rt"))
