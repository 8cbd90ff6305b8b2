#!/bin/bash
set -euo pipefail
cd /work
python3 - <<'PY'
import csv, json, re
out = {}
with open("contacts.csv", newline="") as fh:
    for r in csv.DictReader(fh):
        r = {k: v.strip() for k, v in r.items()}
        email = r["email"].lower()
        if not email or "@" not in email or email in out:
            continue
        d = re.sub(r"[^0-9]", "", r["phone"])
        if len(d) == 11 and d[0] == "1":
            d = d[1:]
        out[email] = {
            "name": r["name"] or None,
            "email": email,
            "phone": f"+1-{d[:3]}-{d[3:6]}-{d[6:]}" if len(d) == 10 else None,
            "country": r["country"].upper() or None,
        }
json.dump([out[k] for k in sorted(out)], open("contacts.json", "w"), indent=2)
PY
