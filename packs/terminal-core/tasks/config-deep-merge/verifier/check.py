"""effective.json must equal the deep merge of the original files."""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def fail(msg: str) -> None:
    print("FAIL:", msg)
    sys.exit(1)


def merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        else:
            out[k] = v
    return out


base = json.load(open(os.path.join(HERE, "base.json")))
prod = json.load(open(os.path.join(HERE, "prod.json")))
want = merge(base, prod)
for name, orig in (("base.json", base), ("prod.json", prod)):
    try:
        if json.load(open(f"/work/config/{name}")) != orig:
            fail(f"config/{name} was modified")
    except (OSError, json.JSONDecodeError):
        fail(f"config/{name} was removed or damaged")
try:
    got = json.load(open("/work/config/effective.json", encoding="utf-8"))
except FileNotFoundError:
    fail("/work/config/effective.json is missing")
except json.JSONDecodeError as e:
    fail(f"/work/config/effective.json is not valid JSON: {e}")
if got != want:
    fail(f"expected {json.dumps(want, sort_keys=True)}\ngot {json.dumps(got, sort_keys=True)}")
print("PASS")
