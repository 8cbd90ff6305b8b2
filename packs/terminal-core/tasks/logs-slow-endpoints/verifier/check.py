"""slowest.txt must name the three slowest endpoints of the untouched log, with their means."""
import hashlib
import sys

LOG_SHA256 = "24784d48aa16988286e13c635061ccc88213f1cbfbb4ecd0d9c2482164942449"


def fail(msg: str) -> None:
    print("FAIL:", msg)
    sys.exit(1)


raw = open("/work/access.log", "rb").read()
if hashlib.sha256(raw).hexdigest() != LOG_SHA256:
    fail("/work/access.log was modified")
times: dict[str, list[float]] = {}
for line in raw.decode().splitlines():
    request = line.split('"')[1]
    after = line.split('"')[2].split()
    if after[0] != "200":
        continue
    path = request.split()[1].split("?")[0]
    times.setdefault(path, []).append(float(after[2]))
means = sorted(((sum(v) / len(v), p) for p, v in times.items()), reverse=True)[:3]
try:
    got = [ln.split() for ln in open("/work/slowest.txt").read().splitlines() if ln.strip()]
except FileNotFoundError:
    fail("/work/slowest.txt is missing")
want = [f"{p} {m:.3f}" for m, p in means]
if len(got) != 3 or any(len(g) != 2 for g in got):
    fail(f"expected 3 lines '<path> <mean>', got {got}")
for (m, p), (gp, gm) in zip(means, got):
    try:
        ok = gp == p and abs(float(gm) - m) <= 0.0006 and len(gm.split(".")[-1]) == 3
    except ValueError:
        ok = False
    if not ok:
        fail(f"expected {want}, got {[' '.join(g) for g in got]}")
print("PASS")
