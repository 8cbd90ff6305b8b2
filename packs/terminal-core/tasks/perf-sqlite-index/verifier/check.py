"""Both queries' plans must use an index search, no scan, no temp B-tree; data unchanged."""
import sqlite3
import sys

QUERIES = [
    "SELECT count(*), max(created_at) FROM events WHERE user_id = :user AND kind = 'purchase'",
    "SELECT id, kind, created_at FROM events WHERE user_id = :user "
    "ORDER BY created_at DESC LIMIT 10",
]


def fail(msg: str) -> None:
    print("FAIL:", msg)
    sys.exit(1)


try:
    db = sqlite3.connect("file:/work/app.db?mode=ro", uri=True)
    stats = db.execute(
        "SELECT count(*), sum(id), sum(user_id), sum(length(kind)), "
        "sum(unicode(substr(created_at, 16, 1))), sum(length(payload)), "
        "sum(CASE kind WHEN 'purchase' THEN id ELSE 0 END) FROM events"
    ).fetchone()
except sqlite3.Error as e:
    fail(f"cannot read the events table: {e}")
# the figures of the 30000 generated rows
WANT_STATS = (30000, 450015000, 45015000, 162000, 1575000, 116700, 90015000)
if tuple(stats) != WANT_STATS:
    fail(f"the rows of events changed: {stats}")
for q in QUERIES:
    plan = [row[-1] for row in db.execute("EXPLAIN QUERY PLAN " + q, {"user": 41})]
    bad = [p for p in plan if p.startswith("SCAN") or "TEMP B-TREE" in p]
    if bad or not any("INDEX" in p for p in plan):
        fail(f"plan of {q!r} is {plan}")
sample = db.execute(QUERIES[0], {"user": 41}).fetchone()
if sample[0] == 0:
    fail("fixture problem: user 41 has no purchases")
print("PASS")
