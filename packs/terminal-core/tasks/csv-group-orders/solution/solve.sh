#!/bin/bash
set -euo pipefail
cd /work
python3 - <<'PY'
import csv, json
from decimal import Decimal
out = {}
with open("orders.csv", newline="") as fh:
    for r in csv.DictReader(fh):
        c = out.setdefault(r["customer"], {"orders": set(), "items": 0, "spent": Decimal(0)})
        c["orders"].add(int(r["order_id"]))
        c["items"] += int(r["qty"])
        c["spent"] += int(r["qty"]) * Decimal(r["unit_price"])
for c in out.values():
    c["orders"] = sorted(c["orders"])
    c["spent"] = float(round(c["spent"], 2))
json.dump(out, open("customers.json", "w"), indent=2, sort_keys=True)
PY
