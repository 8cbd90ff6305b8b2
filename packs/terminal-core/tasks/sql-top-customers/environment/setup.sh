set -e
sqlite3 shop.db < data.sql
rm data.sql
