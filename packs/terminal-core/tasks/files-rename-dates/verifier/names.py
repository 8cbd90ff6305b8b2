"""(original name, expected name) of every file in /work/reports; its content is its original name."""
PAIRS = [
    ("sales_eu_03-15-2024.csv", "2024-03-15_sales_eu.csv"),
    ("sales_us_03-15-2024.csv", "2024-03-15_sales_us.csv"),
    ("inventory_12-01-2023.txt", "2023-12-01_inventory.txt"),
    ("q-review_notes_01-31-2024.md", "2024-01-31_q-review_notes.md"),
    ("backup_06-30-2022.tar", "2022-06-30_backup.tar"),
    ("audit_11-02-2023_11-09-2023.log", "2023-11-09_audit_11-02-2023.log"),
    ("x_07-04-2021.json", "2021-07-04_x.json"),
    ("README.txt", "README.txt"),
    ("summary_2024.txt", "summary_2024.txt"),
    ("draft_3-5-2024.md", "draft_3-5-2024.md"),
    ("notes-10-10-2020.txt", "notes-10-10-2020.txt"),
]
