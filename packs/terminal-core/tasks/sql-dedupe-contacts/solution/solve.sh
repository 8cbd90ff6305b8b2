#!/bin/bash
set -euo pipefail
cd /work
sqlite3 crm.db <<'SQL'
BEGIN;
CREATE TEMP TABLE keeper AS
  SELECT c.id AS id, (SELECT min(d.id) FROM contacts d
                      WHERE lower(trim(d.email)) = lower(trim(c.email))) AS kept
  FROM contacts c;
UPDATE notes SET contact_id = (SELECT kept FROM keeper WHERE keeper.id = notes.contact_id);
DELETE FROM contacts WHERE id IN (SELECT id FROM keeper WHERE id <> kept);
UPDATE contacts SET email = lower(trim(email));
CREATE UNIQUE INDEX contacts_email ON contacts(email);
COMMIT;
SQL
sqlite3 crm.db 'SELECT count(*) FROM contacts;'
