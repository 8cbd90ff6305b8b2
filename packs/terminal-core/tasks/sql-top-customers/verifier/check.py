"""top_customers.csv must match the answer computed on a pristine copy of the data."""
import csv
import os
import sqlite3
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def fail(msg: str) -> None:
    print("FAIL:", msg)
    sys.exit(1)


ref = sqlite3.connect(":memory:")
ref.executescript(open(os.path.join(HERE, "data.sql")).read())
rows = ref.execute("""
    SELECT c.name, sum(i.qty * p.price_cents) AS cents
    FROM orders o JOIN customers c ON c.id = o.customer_id
    JOIN order_items i ON i.order_id = o.id JOIN products p ON p.id = i.product_id
    WHERE o.status = 'paid' AND o.ordered_at >= '2024-01-01' AND o.ordered_at < '2025-01-01'
    GROUP BY c.id ORDER BY cents DESC, c.name ASC LIMIT 5""").fetchall()
want = [["customer", "revenue"]] + [[n, f"{c // 100}.{c % 100:02d}"] for n, c in rows]
try:
    with open("/work/top_customers.csv", newline="") as fh:
        got = [[x.strip() for x in r] for r in csv.reader(fh) if r]
except FileNotFoundError:
    fail("/work/top_customers.csv is missing")
if got != want:
    fail(f"expected {want}\ngot {got}")
try:
    db = sqlite3.connect("file:/work/shop.db?mode=ro", uri=True)
    for table in ("customers", "products", "orders", "order_items"):
        if db.execute(f"SELECT * FROM {table} ORDER BY 1, 2").fetchall() != \
                ref.execute(f"SELECT * FROM {table} ORDER BY 1, 2").fetchall():
            fail(f"table {table} was modified")
except sqlite3.Error as e:
    fail(f"shop.db is damaged: {e}")
print("PASS")
