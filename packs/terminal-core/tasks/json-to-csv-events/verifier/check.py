"""events.csv, read back with a strict CSV reader, must hold the expected rows."""
import csv
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def fail(msg: str) -> None:
    print("FAIL:", msg)
    sys.exit(1)


events = json.load(open(os.path.join(HERE, "events.json"), encoding="utf-8"))
want = [["id", "timestamp", "user", "action", "detail"]]
for e in sorted(events, key=lambda e: e["ts"]):
    want.append([str(e["id"]), e["ts"], e["user"]["name"], e["action"], e.get("detail", "")])
try:
    with open("/work/events.csv", newline="", encoding="utf-8") as fh:
        got = list(csv.reader(fh, strict=True))
except FileNotFoundError:
    fail("/work/events.csv is missing")
except (csv.Error, UnicodeDecodeError) as e:
    fail(f"/work/events.csv is not valid UTF-8 CSV: {e}")
got = [row for row in got if row]
if got != want:
    fail(f"expected rows {want}\ngot {got}")
print("PASS")
