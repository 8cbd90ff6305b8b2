#!/bin/bash
set -euo pipefail
cd /work
sqlite3 hr.db <<'SQL'
CREATE VIEW top_earners AS
SELECT department, employee, salary FROM (
  SELECT d.name AS department, e.name AS employee, e.salary AS salary,
         row_number() OVER (PARTITION BY e.dept_id ORDER BY e.salary DESC, e.hired_on, e.id) AS rn
  FROM employees e JOIN departments d ON d.id = e.dept_id
) WHERE rn = 1;
SQL
sqlite3 -header hr.db 'SELECT * FROM top_earners;'
