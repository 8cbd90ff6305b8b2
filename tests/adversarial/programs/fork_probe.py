"""Fork up to `n` sleeping children, print how many started (a bounded fork bomb)."""

import json
import os
import signal
import sys
import time

n = json.loads(sys.stdin.read() or "{}").get("n", 300)
kids = []
for _ in range(n):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    kids.append(pid)
print(len(kids), flush=True)
for pid in kids:
    os.kill(pid, signal.SIGKILL)
for pid in kids:
    os.waitpid(pid, 0)
