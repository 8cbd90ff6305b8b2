"""Children that each fill `mb` MiB and hold it: once each has filled or died, print how
many hold it.

Each child's own allocation is under its address-space limit; together they are not."""

import contextlib
import json
import os
import signal
import sys
import time

args = json.loads(sys.stdin.read() or "{}")
mb, kids_n = args.get("mb", 200), args.get("kids", 4)
r, w = os.pipe()
kids = []
for _ in range(kids_n):
    pid = os.fork()
    if pid == 0:
        os.close(r)
        blob = b"x" * (mb << 20)  # written, so resident
        os.write(w, b"%8d" % os.getpid())
        time.sleep(30)
        os._exit(len(blob) & 0)
    kids.append(pid)
os.close(w)
os.set_blocking(r, False)
filled, dead = set(), set()
deadline = time.monotonic() + args.get("wait", 15)
while len(filled | dead) < len(kids) and time.monotonic() < deadline:
    time.sleep(0.1)
    try:
        while chunk := os.read(r, 8):
            filled.add(int(chunk))
    except BlockingIOError:
        pass
    dead |= {pid for pid in kids if pid not in dead and os.waitpid(pid, os.WNOHANG)[0] != 0}
alive = {pid for pid in kids if pid not in dead}
print(json.dumps({"holding": len(filled & alive), "filled": len(filled)}), flush=True)
for pid in kids:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
