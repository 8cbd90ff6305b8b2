#!/bin/bash
set -euo pipefail
cd /work
python3 - <<'PY'
p = "orders.py"
s = open(p).read()
s = s.replace('def new_order(customer, items=[]):\n    return {"customer": customer, "items": items}',
              'def new_order(customer, items=None):\n    return {"customer": customer, "items": list(items or [])}')
s = s.replace("def summary(orders, totals={}):\n", "def summary(orders):\n    totals = {}\n")
open(p, "w").write(s)
PY
python3 -B demo.py
