set -e
sqlite3 inventory.db < data.sql
rm data.sql
