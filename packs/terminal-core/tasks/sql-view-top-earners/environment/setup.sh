set -e
sqlite3 hr.db < data.sql
rm data.sql
