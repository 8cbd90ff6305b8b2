"""contacts.json must equal the cleaning rules applied to the original CSV."""
import csv
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def fail(msg: str) -> None:
    print("FAIL:", msg)
    sys.exit(1)


def phone(text: str) -> str | None:
    digits = re.sub(r"\D", "", text)
    if len(digits) == 11 and digits.startswith("1"):
        digits = digits[1:]
    if len(digits) != 10:
        return None
    return f"+1-{digits[:3]}-{digits[3:6]}-{digits[6:]}"


seen: dict[str, dict] = {}
with open(os.path.join(HERE, "contacts.csv"), newline="") as fh:
    for row in csv.DictReader(fh):
        row = {k: v.strip() for k, v in row.items()}
        email = row["email"].lower()
        if "@" not in email or email in seen:
            continue
        seen[email] = {
            "name": row["name"] or None,
            "email": email,
            "phone": phone(row["phone"]),
            "country": row["country"].upper() or None,
        }
want = [seen[e] for e in sorted(seen, key=str.encode)]
try:
    got = json.load(open("/work/contacts.json", encoding="utf-8"))
except FileNotFoundError:
    fail("/work/contacts.json is missing")
except json.JSONDecodeError as e:
    fail(f"/work/contacts.json is not valid JSON: {e}")
if got != want:
    fail(f"expected {json.dumps(want, indent=1)}\ngot {json.dumps(got, indent=1)}")
print("PASS")
