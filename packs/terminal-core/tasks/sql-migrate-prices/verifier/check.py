"""items must have the four columns, the same rows, and exact integer cents."""
import os
import sqlite3
import sys
from decimal import Decimal

HERE = os.path.dirname(os.path.abspath(__file__))


def fail(msg: str) -> None:
    print("FAIL:", msg)
    sys.exit(1)


def cents(text: str | None) -> int | None:
    if text is None:
        return None
    t = text.replace(" ", "").replace("$", "").replace(",", "")
    return None if not t else int(Decimal(t) * 100)


ref = sqlite3.connect(":memory:")
ref.executescript(open(os.path.join(HERE, "data.sql")).read())
want = [(i, n, c, cents(p)) for i, n, c, p in ref.execute("SELECT * FROM items ORDER BY id")]
try:
    db = sqlite3.connect("file:/work/inventory.db?mode=ro", uri=True)
    cols = sorted(r[1] for r in db.execute("PRAGMA table_info(items)"))
    if cols != ["category", "id", "name", "price_cents"]:
        fail(f"items should have the columns id, name, category, price_cents; it has {cols}")
    got = db.execute("SELECT id, name, category, price_cents FROM items ORDER BY id").fetchall()
    types = {r[0] for r in db.execute("SELECT DISTINCT typeof(price_cents) FROM items")}
except sqlite3.Error as e:
    fail(f"cannot read items: {e}")
if types - {"integer", "null"}:
    fail(f"price_cents holds values of type {sorted(types)}, want integer (or null)")
if got != want:
    bad = [(g, w) for g, w in zip(got, want) if g != w][:3]
    fail(f"rows differ (got, want): {bad or (len(got), len(want))}")
print("PASS")
