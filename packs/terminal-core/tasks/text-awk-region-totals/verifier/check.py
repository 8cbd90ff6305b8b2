"""totals.txt must match the revenues computed exactly (Decimal) from the untouched input."""
import hashlib
import sys
from decimal import Decimal

SALES_SHA256 = "3ca2f609e9cea02969fc0fab34012dd33633afae1371cd133c3353af6b68ee1a"


def fail(msg: str) -> None:
    print("FAIL:", msg)
    sys.exit(1)


data = open("/work/sales.txt", "rb").read()
if hashlib.sha256(data).hexdigest() != SALES_SHA256:
    fail("/work/sales.txt was modified")
rows = [ln.split() for ln in data.decode().splitlines() if ln.strip() and not ln.startswith("#")]
totals: dict[str, Decimal] = {}
for _date, region, _prod, qty, price in rows[1:]:
    totals[region] = totals.get(region, Decimal(0)) + int(qty) * Decimal(price)
want = [f"{r} {t:.2f}" for r, t in sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))]
want.append(f"TOTAL {sum(totals.values()):.2f}")
try:
    got = open("/work/totals.txt", encoding="utf-8").read().splitlines()
except FileNotFoundError:
    fail("/work/totals.txt is missing")
got = [" ".join(line.split()) for line in got if line.strip()]
if got != want:
    fail(f"expected:\n{chr(10).join(want)}\ngot:\n{chr(10).join(got)}")
print("PASS")
