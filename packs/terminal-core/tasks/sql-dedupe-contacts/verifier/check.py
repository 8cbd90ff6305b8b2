"""contacts deduplicated to the lowest id, notes re-pointed, emails normalized, unique index."""
import os
import shutil
import sqlite3
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def fail(msg: str) -> None:
    print("FAIL:", msg)
    sys.exit(1)


ref = sqlite3.connect(":memory:")
ref.executescript(open(os.path.join(HERE, "data.sql")).read())
keep: dict[str, int] = {}
names = {}
owner = {}
for cid, email, name in ref.execute("SELECT id, email, name FROM contacts ORDER BY id"):
    key = email.strip().lower()
    keep.setdefault(key, cid)
    names[cid] = name
    owner[cid] = keep[key]
want_contacts = sorted((cid, key, names[cid]) for key, cid in keep.items())
want_notes = [(nid, owner[c], body) for nid, c, body in
              ref.execute("SELECT id, contact_id, body FROM notes ORDER BY id")]
if len(want_contacts) == len(names):
    fail("fixture problem: no duplicates")
with tempfile.TemporaryDirectory() as tmp:
    copy = os.path.join(tmp, "crm.db")
    try:
        shutil.copy("/work/crm.db", copy)
        if os.path.exists("/work/crm.db-wal"):  # a database left in WAL mode
            shutil.copy("/work/crm.db-wal", copy + "-wal")
    except OSError as e:
        fail(f"cannot read /work/crm.db: {e}")
    db = sqlite3.connect(copy)
    try:
        got_contacts = db.execute("SELECT id, email, name FROM contacts ORDER BY id").fetchall()
        got_notes = db.execute("SELECT id, contact_id, body FROM notes ORDER BY id").fetchall()
    except sqlite3.Error as e:
        fail(f"cannot read the tables: {e}")
    if got_contacts != want_contacts:
        fail(f"contacts differ: got {len(got_contacts)} rows, want {len(want_contacts)}; "
             f"first differences {[r for r in got_contacts if r not in want_contacts][:3]}")
    if got_notes != want_notes:
        fail(f"notes differ: {[(g, w) for g, w in zip(got_notes, want_notes) if g != w][:3]}")
    try:
        db.execute("INSERT INTO contacts (email, name) VALUES (?, 'dup')", (want_contacts[0][1],))
        fail("inserting a contact with an existing email succeeded: add a unique index")
    except sqlite3.IntegrityError:
        pass
    db.close()
print("PASS")
