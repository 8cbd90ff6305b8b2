set -e
mkdir -p reports
printf 'original name: sales_eu_03-15-2024.csv\n' > 'reports/sales_eu_03-15-2024.csv'
printf 'original name: sales_us_03-15-2024.csv\n' > 'reports/sales_us_03-15-2024.csv'
printf 'original name: inventory_12-01-2023.txt\n' > 'reports/inventory_12-01-2023.txt'
printf 'original name: q-review_notes_01-31-2024.md\n' > 'reports/q-review_notes_01-31-2024.md'
printf 'original name: backup_06-30-2022.tar\n' > 'reports/backup_06-30-2022.tar'
printf 'original name: audit_11-02-2023_11-09-2023.log\n' > 'reports/audit_11-02-2023_11-09-2023.log'
printf 'original name: x_07-04-2021.json\n' > 'reports/x_07-04-2021.json'
printf 'original name: README.txt\n' > 'reports/README.txt'
printf 'original name: summary_2024.txt\n' > 'reports/summary_2024.txt'
printf 'original name: draft_3-5-2024.md\n' > 'reports/draft_3-5-2024.md'
printf 'original name: notes-10-10-2020.txt\n' > 'reports/notes-10-10-2020.txt'
