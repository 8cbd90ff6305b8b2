#!/bin/bash
set -euo pipefail
cd /work
sqlite3 -csv -header shop.db > top_customers.csv <<'SQL'
SELECT c.name AS customer, printf('%.2f', sum(i.qty * p.price_cents) / 100.0) AS revenue
FROM orders o
JOIN customers c ON c.id = o.customer_id
JOIN order_items i ON i.order_id = o.id
JOIN products p ON p.id = i.product_id
WHERE o.status = 'paid' AND o.ordered_at LIKE '2024-%'
GROUP BY c.id
ORDER BY sum(i.qty * p.price_cents) DESC, c.name
LIMIT 5;
SQL
cat top_customers.csv
