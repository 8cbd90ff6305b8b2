"""admins.json must equal the list computed from the untouched users.json."""
import hashlib
import json
import sys

USERS_SHA256 = "d18c09214da9cdea49f57b73f8e316feed96ec3b68e0872134643ee364c5afe0"


def fail(msg: str) -> None:
    print("FAIL:", msg)
    sys.exit(1)


raw = open("/work/users.json", "rb").read()
if hashlib.sha256(raw).hexdigest() != USERS_SHA256:
    fail("/work/users.json was modified")
users = json.loads(raw)
want = sorted(
    ({"id": u["id"], "email": u["email"].lower()} for u in users
     if u["active"] is True and "admin" in u["roles"]),
    key=lambda u: u["id"],
)
if len(want) < 3:
    fail("fixture has too few admins")
try:
    got = json.load(open("/work/admins.json", encoding="utf-8"))
except FileNotFoundError:
    fail("/work/admins.json is missing")
except json.JSONDecodeError as e:
    fail(f"/work/admins.json is not valid JSON: {e}")
if got != want:
    fail(f"expected {want}\ngot {got}")
print("PASS")
