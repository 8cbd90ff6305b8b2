set -e
sqlite3 app.db <<'SQL'
CREATE TABLE events (
  id INTEGER PRIMARY KEY,
  user_id INTEGER NOT NULL,
  kind TEXT NOT NULL,
  created_at TEXT NOT NULL,
  payload TEXT
);
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 30000)
INSERT INTO events (id, user_id, kind, created_at, payload)
SELECT i,
       (i * 7919) % 3000 + 1,
       CASE i % 5 WHEN 0 THEN 'purchase' WHEN 1 THEN 'login' WHEN 2 THEN 'view' WHEN 3 THEN 'view' ELSE 'logout' END,
       strftime('%Y-%m-%dT%H:%M:%SZ', 1700000000 + i * 37, 'unixepoch'),
       'p' || (i * 31 % 1000)
FROM n;
SQL
