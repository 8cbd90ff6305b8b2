"""Run `python3 -m shop.cli` on fresh carts and compare with a reference; probe price_of."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

# python3 from PATH: sys.executable can name a wrapper that a noexec /tmp cannot run
PYTHON = shutil.which("python3") or "/usr/bin/python3"

PRICES = {"apple": 0.5, "bread": 2.25, "cheese": 7.8, "dates": 4.0}
CARTS = [
    [{"sku": "apple", "qty": 12}, {"sku": "bread", "qty": 1}, {"sku": "cheese", "qty": 2}],
    [{"sku": "dates", "qty": 10}, {"sku": "dates", "qty": 9}, {"sku": "cheese", "qty": 11}],
    [],
    [{"sku": "bread", "qty": 3}],
]


def fail(msg: str) -> None:
    print("FAIL:", msg)
    sys.exit(1)


def reference(cart: list[dict]) -> str:
    out, total = [], 0.0
    for e in cart:
        base = PRICES[e["sku"]]
        line = (base * 0.9 if e["qty"] >= 10 else base) * e["qty"]
        total += line
        out.append(f"{e['sku']} x{e['qty']} = {line:.2f}")
    out.append(f"TOTAL {total:.2f}")
    return "\n".join(out) + "\n"


env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
with tempfile.TemporaryDirectory() as tmp:
    for i, cart in enumerate(CARTS):
        path = os.path.join(tmp, f"cart{i}.json")
        with open(path, "w") as fh:
            json.dump(cart, fh)
        r = subprocess.run([PYTHON, "-m", "shop.cli", path], cwd="/work",
                           capture_output=True, text=True, timeout=20, env=env)
        if r.returncode != 0:
            fail(f"cart {i}: exit status {r.returncode}: {r.stderr.strip()[-300:]}")
        if r.stdout != reference(cart):
            fail(f"cart {i}: printed {r.stdout!r}, want {reference(cart)!r}")
probe = ("from shop.pricing import price_of\n"
         "try:\n    price_of('apple')\nexcept TypeError:\n    print('OK')\n")
r = subprocess.run([PYTHON, "-c", probe], cwd="/work", capture_output=True, text=True,
                   timeout=20, env=env)
if r.stdout.strip() != "OK":
    fail(f"price_of must raise TypeError for a non-Item: {r.stdout!r} {r.stderr[-300:]!r}")
print("PASS")
