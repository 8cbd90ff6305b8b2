"""customers.json must equal the per-customer aggregation of the original CSV."""
import csv
import json
import os
import sys
from decimal import Decimal

HERE = os.path.dirname(os.path.abspath(__file__))


def fail(msg: str) -> None:
    print("FAIL:", msg)
    sys.exit(1)


agg: dict[str, dict] = {}
with open(os.path.join(HERE, "orders.csv"), newline="") as fh:
    for r in csv.DictReader(fh):
        a = agg.setdefault(r["customer"], {"orders": set(), "items": 0, "spent": Decimal(0)})
        a["orders"].add(int(r["order_id"]))
        a["items"] += int(r["qty"])
        a["spent"] += int(r["qty"]) * Decimal(r["unit_price"])
try:
    got = json.load(open("/work/customers.json", encoding="utf-8"))
except FileNotFoundError:
    fail("/work/customers.json is missing")
except json.JSONDecodeError as e:
    fail(f"/work/customers.json is not valid JSON: {e}")
if not isinstance(got, dict) or sorted(got) != sorted(agg):
    fail(f"expected the keys {sorted(agg)}")
for name, a in agg.items():
    g = got[name]
    if not isinstance(g, dict) or sorted(g) != ["items", "orders", "spent"]:
        fail(f"{name}: expected an object with keys items, orders, spent, got {g}")
    if g["orders"] != sorted(a["orders"]) or any(type(o) is not int for o in g["orders"]):
        fail(f"{name}: orders should be {sorted(a['orders'])}, got {g['orders']}")
    if type(g["items"]) is not int or g["items"] != a["items"]:
        fail(f"{name}: items should be {a['items']}, got {g['items']}")
    want_spent = float(round(a["spent"], 2))
    if type(g["spent"]) not in (int, float) or abs(g["spent"] - want_spent) > 1e-6:
        fail(f"{name}: spent should be {want_spent}, got {g['spent']}")
print("PASS")
