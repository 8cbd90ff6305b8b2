set -e
mkdir -p logs
python3 - <<'GEN'
import random
rng = random.Random(404)
t = 1728554400  # 2024-10-10T10:00:00Z
events = []
open_reqs = []
n = 0
for step in range(2400):
    t += rng.randint(0, 3)
    if open_reqs and rng.random() < 0.48:
        rid = open_reqs.pop(rng.randrange(len(open_reqs)))
        if rng.random() < 0.93:
            events.append((t, f"INFO req={rid} event=end status={rng.choice([200, 200, 404, 500])} ms={rng.randint(1, 900)}"))
        continue
    if rng.random() < 0.05:
        events.append((t, f"WARN worker={rng.randint(1, 8)} message=\"slow disk\""))
        continue
    n += 1
    rid = f"{rng.getrandbits(32):08x}"
    open_reqs.append(rid)
    events.append((t, f"INFO req={rid} event=start path={rng.choice(['/a', '/b', '/c/d'])}"))
    if rng.random() < 0.1:
        events.append((t, f"DEBUG req={rid} event=retry attempt=2"))
# a few requests that ended in the logs but started before the oldest file: not unfinished
for i in range(3):
    events.insert(5 + i * 7, (events[5 + i * 7][0], f"INFO req=old{i:05d} event=end status=200 ms=3"))
import time
lines = [time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts)) + " " + msg for ts, msg in events]
chunks = [lines[:700], lines[700:1300], lines[1300:1900], lines[1900:]]
for name, chunk in zip(["app.log.3", "app.log.2", "app.log.1", "app.log"], chunks):
    with open(f"logs/{name}", "w") as fh:
        fh.write("\n".join(chunk) + "\n")
GEN
gzip -n logs/app.log.3 logs/app.log.2
