#!/bin/bash
set -euo pipefail
cd /work
# models imports pricing at import time and pricing imports models: defer one side.
python3 - <<'PY'
p = "shop/models.py"
s = open(p).read()
s = s.replace("from shop.pricing import price_of\n\n\n", "")
s = s.replace("        return price_of(self) * self.qty",
              "        from shop.pricing import price_of\n\n        return price_of(self) * self.qty")
open(p, "w").write(s)
PY
python3 -B -m shop.cli cart.json
