"""top_ips.txt must hold the five busiest IPs of the untouched log, with the tie rule."""
import collections
import hashlib
import sys

LOG_SHA256 = "48a9f2060f768c75eff247e4b0e97993e846ccac52ac7a593d7d148478e8bd16"


def fail(msg: str) -> None:
    print("FAIL:", msg)
    sys.exit(1)


raw = open("/work/access.log", "rb").read()
if hashlib.sha256(raw).hexdigest() != LOG_SHA256:
    fail("/work/access.log was modified")
counts = collections.Counter(line.split()[0] for line in raw.decode().splitlines() if line)
top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0].encode()))[:5]
want = [f"{n} {ip}" for ip, n in top]
try:
    got = [" ".join(ln.split()) for ln in open("/work/top_ips.txt").read().splitlines() if ln.strip()]
except FileNotFoundError:
    fail("/work/top_ips.txt is missing")
if got != want:
    fail(f"expected {want}, got {got}")
print("PASS")
