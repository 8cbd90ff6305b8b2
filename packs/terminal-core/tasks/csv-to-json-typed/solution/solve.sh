#!/bin/bash
set -euo pipefail
cd /work
python3 - <<'PY'
import csv, json
rows = []
with open("people.csv", newline="") as fh:
    for r in csv.DictReader(fh):
        rows.append({
            "id": int(r["id"]),
            "name": r["name"].strip(),
            "age": int(r["age"]) if r["age"].strip() else None,
            "email": r["email"],
            "active": r["active"].strip().lower() == "yes",
            "score": float(r["score"]) if r["score"].strip() else None,
        })
with open("people.json", "w") as fh:
    json.dump(rows, fh, indent=2)
PY
