"""people.json must equal the typed conversion of the original CSV."""
import csv
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def fail(msg: str) -> None:
    print("FAIL:", msg)
    sys.exit(1)


want = []
with open(os.path.join(HERE, "people.csv"), newline="") as fh:
    for row in csv.DictReader(fh):
        want.append({
            "id": int(row["id"]),
            "name": row["name"].strip(),
            "age": int(row["age"]) if row["age"].strip() else None,
            "email": row["email"],
            "active": row["active"].lower() == "yes",
            "score": float(row["score"]) if row["score"].strip() else None,
        })
try:
    got = json.load(open("/work/people.json", encoding="utf-8"))
except FileNotFoundError:
    fail("/work/people.json is missing")
except json.JSONDecodeError as e:
    fail(f"/work/people.json is not valid JSON: {e}")
if not isinstance(got, list) or len(got) != len(want):
    fail(f"expected an array of {len(want)} objects")
for i, (g, w) in enumerate(zip(got, want)):
    if not isinstance(g, dict) or g != w:
        fail(f"row {i + 1}: expected {w}, got {g}")
    for key in ("id", "age"):
        if isinstance(g[key], bool) or (g[key] is not None and not isinstance(g[key], int)):
            fail(f"row {i + 1}: {key} must be an integer")
    if isinstance(g["active"], bool) is False:
        fail(f"row {i + 1}: active must be a boolean")
print("PASS")
