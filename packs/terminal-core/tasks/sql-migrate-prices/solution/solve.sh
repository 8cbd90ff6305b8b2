#!/bin/bash
set -euo pipefail
cd /work
sqlite3 inventory.db <<'SQL'
ALTER TABLE items ADD COLUMN price_cents INTEGER;
UPDATE items SET price_cents = CASE
  WHEN trim(replace(replace(replace(coalesce(price, ''), ' ', ''), '$', ''), ',', '')) = '' THEN NULL
  ELSE CAST(round(CAST(replace(replace(replace(price, ' ', ''), '$', ''), ',', '') AS REAL) * 100) AS INTEGER)
END;
ALTER TABLE items DROP COLUMN price;
SQL
sqlite3 inventory.db 'SELECT * FROM items LIMIT 7;'
