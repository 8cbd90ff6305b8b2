#!/bin/bash
set -euo pipefail
cd /work
sqlite3 app.db 'CREATE INDEX events_user_created ON events (user_id, created_at);'
sqlite3 app.db "EXPLAIN QUERY PLAN SELECT id, kind, created_at FROM events WHERE user_id = 41 ORDER BY created_at DESC LIMIT 10;"
