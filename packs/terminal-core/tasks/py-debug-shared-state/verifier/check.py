"""Exercise orders.py in a fresh interpreter against the documented behaviour.

The probe imports the agent's module, so its output is the agent's to print: it proves
it ran to the end by printing a random token it read from stdin before the import."""
import secrets
import shutil
import subprocess
import sys

# python3 from PATH: sys.executable can name a wrapper that a noexec /tmp cannot run
PYTHON = shutil.which("python3") or "/usr/bin/python3"

PROBE = r'''
import sys
def _token(line=sys.stdin.readline().strip()):
    return line
sys.stdin.close()
sys.path.insert(0, "/work")
import orders

a = orders.new_order("ana")
b = orders.new_order("ben")
orders.add_item(a, "pen", 2)
assert b["items"] == [], f"adding to one order changed another: {b}"
assert a["items"] == [("pen", 2)], a
mine = [("cup", 1)]
c = orders.new_order("cy", mine)
orders.add_item(c, "lid", 3)
assert mine == [("cup", 1)], f"the caller's list was changed: {mine}"
assert c["items"] == [("cup", 1), ("lid", 3)], c
d = orders.new_order("ana")
orders.add_item(d, "ink")
assert d["items"] == [("ink", 1)], d
s1 = orders.summary([a, b, c, d])
s2 = orders.summary([a, b, c, d])
assert s1 == {"ana": 3, "ben": 0, "cy": 4}, s1
assert s2 == s1, f"second call gave {s2}"
assert s1 is not s2, "summary returned the same dict twice"
s1["ana"] = 99
assert orders.summary([b]) == {"ben": 0}, orders.summary([b])
assert orders.add_item(b, "x") is b
print(_token())
'''

token = secrets.token_hex(16)
r = subprocess.run([PYTHON, "-B", "-c", PROBE], capture_output=True, text=True,
                   timeout=20, cwd="/tmp", input=token + "\n")
if r.returncode != 0 or r.stdout.strip().splitlines()[-1:] != [token]:
    print("FAIL:", (r.stderr.strip().splitlines() or ["no output"])[-1])
    sys.exit(1)
print("PASS")
