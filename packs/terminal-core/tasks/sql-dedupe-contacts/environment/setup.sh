set -e
sqlite3 crm.db < data.sql
rm data.sql
