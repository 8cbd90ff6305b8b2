"""The sandbox backends of a server that runs as a normal user (run by test_server_files.py).

Run as that user with the system python3: argv[1] is the venv's site-packages, stdin a JSON
{"attack": the attack script, "secret": a value for the server's environment and files,
"checkout": the repository}. Makes a data
dir under $HOME with the server's files, attacks them from a bwrap sandbox and from a
fork-server run, prints one JSON line and removes what it made."""

import asyncio
import json
import os
import shutil
import site
import sqlite3
import sys
import tempfile
from pathlib import Path

site.addsitedir(sys.argv[1])

from palaestra.sandbox.base import SandboxSpec
from palaestra.sandbox.bwrap import BwrapBackend
from palaestra.sandbox.forkrun import PythonRun
from palaestra.sandbox.forkserver import PythonForkServer

args = json.loads(sys.stdin.read())
os.environ["PALAESTRA_ADVERSARIAL_SECRET"] = args["secret"]

READER = """
import glob, sys
data, pid = sys.stdin.read().split()
def read(p):
    try:
        return open(p, 'rb').read().decode('latin-1')
    except OSError:
        return None
files = [data + '/palaestra.sqlite3', data + '/admin.token', *glob.glob(data + '/packs/*/*/*')]
print(repr([t for t in map(read, files) if t is not None]))
for p in ['/proc/1/environ', '/proc/%s/environ' % pid, *glob.glob('/proc/[0-9]*/environ')]:
    print(p, read(p))
print('mounts:')
print(open('/proc/self/mountinfo').read())
"""


async def main(data: Path, cache: Path) -> dict[str, object]:
    backend, forks = BwrapBackend(cache=cache), PythonForkServer()
    out: dict[str, object] = {"data": str(data), "pid": os.getpid(), "uid": os.getuid()}
    try:
        box = await backend.create(SandboxSpec())
        try:
            await box.write_file("attack.sh", args["attack"])
            argv = ["sh", "attack.sh", str(data), str(os.getpid()), args["checkout"]]
            r = await box.exec(argv, max_output=4 << 20)
            out["bwrap"] = [r.exit_code, r.stdout + r.stderr]
        finally:
            await box.close()
        stdin = f"{data} {os.getpid()}".encode()
        job = PythonRun(READER, stdin=stdin, timeout=20, max_output=1 << 20, memory_mb=256)
        r = await forks.run(job)
        out["fork"] = [r.exit_code, r.stdout + r.stderr]
    finally:
        await forks.aclose()
        await backend.aclose()
    return out


top = Path(tempfile.mkdtemp(prefix=".palaestra-adversarial-", dir=Path.home()))
data = top / "data"
cache = top / "cache"  # the exec helper's build, removed below
try:
    os.chmod(top, 0o755)
    data.mkdir(mode=0o755)
    db = sqlite3.connect(data / "palaestra.sqlite3")
    db.execute("CREATE TABLE secrets (v TEXT)")
    db.execute("INSERT INTO secrets VALUES (?)", (args["secret"],))
    db.commit()
    db.close()
    (data / "admin.token").write_text(args["secret"] + "\n")
    pack = data / "packs" / "sha256" / ("0" * 12)
    pack.mkdir(parents=True)
    (pack / "tasks.jsonl").write_text(json.dumps({"private": args["secret"]}) + "\n")
    for p in (data / "palaestra.sqlite3", data / "admin.token", pack / "tasks.jsonl"):
        p.chmod(0o644)  # a careless umask: only the sandbox's mounts keep them out
    print(json.dumps(asyncio.run(main(data, cache))))
finally:
    shutil.rmtree(top, ignore_errors=True)
