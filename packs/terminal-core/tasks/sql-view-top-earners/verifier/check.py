"""Query top_earners on a copy of the database, before and after inserting new rows."""
import os
import shutil
import sqlite3
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
EXTRA = [
    # a new top earner in Support, a tie in Finance broken by hire date, then by id
    "INSERT INTO employees VALUES (100, 'New Star', 3, 500000, '2024-05-01')",
    "INSERT INTO employees VALUES (101, 'Tie Late', 4, 400000, '2023-01-02')",
    "INSERT INTO employees VALUES (102, 'Tie Early B', 4, 400000, '2023-01-01')",
    "INSERT INTO employees VALUES (99, 'Tie Early A', 4, 400000, '2023-01-01')",
    "INSERT INTO employees VALUES (103, 'First Researcher', 6, 10, '2024-01-01')",
    "INSERT INTO departments VALUES (7, 'Empty')",
    "INSERT INTO employees VALUES (104, 'Nobody Dept', NULL, 999999, '2000-01-01')",
]


def fail(msg: str) -> None:
    print("FAIL:", msg)
    sys.exit(1)


def reference(db: sqlite3.Connection) -> list[tuple]:
    best: dict[str, tuple] = {}
    rows = db.execute("SELECT d.name, e.name, e.salary, e.hired_on, e.id FROM employees e "
                      "JOIN departments d ON d.id = e.dept_id").fetchall()
    for dept, name, salary, hired, eid in rows:
        key = (-salary, hired, eid)
        if dept not in best or key < best[dept][0]:
            best[dept] = (key, (dept, name, salary))
    return sorted(v[1] for v in best.values())


ref = sqlite3.connect(":memory:")
ref.executescript(open(os.path.join(HERE, "data.sql")).read())
with tempfile.TemporaryDirectory() as tmp:
    copy = os.path.join(tmp, "hr.db")
    try:
        shutil.copy("/work/hr.db", copy)
    except OSError as e:
        fail(f"cannot read /work/hr.db: {e}")
    db = sqlite3.connect(copy)
    for table in ("departments", "employees"):
        try:
            same = db.execute(f"SELECT * FROM {table} ORDER BY id").fetchall() == \
                ref.execute(f"SELECT * FROM {table} ORDER BY id").fetchall()
        except sqlite3.Error as e:
            fail(f"cannot read {table}: {e}")
        if not same:
            fail(f"the rows of {table} were changed")
    for stage in ("as shipped", "after new rows"):
        try:
            cur = db.execute("SELECT department, employee, salary FROM top_earners")
            got = sorted(cur.fetchall())
            cols = [c[0] for c in db.execute("SELECT * FROM top_earners").description]
        except sqlite3.Error as e:
            fail(f"cannot query the view top_earners: {e}")
        kind = db.execute("SELECT type FROM sqlite_master WHERE name = 'top_earners'").fetchone()
        if kind != ("view",):
            fail("top_earners must be a view")
        if cols != ["department", "employee", "salary"]:
            fail(f"top_earners has the columns {cols}, want department, employee, salary")
        if got != reference(db):
            fail(f"{stage}: top_earners gives {got}, want {reference(db)}")
        if stage == "as shipped":
            for stmt in EXTRA:
                db.execute(stmt)
    db.close()
print("PASS")
