"""The table of held-out draws (server/draws.py `DrawBook`) on SQLite and PostgreSQL: a
split with no row is at draw 0; a rotation advances only from the draw it saw, so two
processes rotating at once make one draw, not two; the schedule's clock starts once."""

from __future__ import annotations

from palaestra.server.db import Database
from palaestra.server.draws import DrawBook
from palaestra.server.store import Store


def test_draws_on_both_engines(store_url: str) -> None:
    store = Store(Database.open(store_url))  # migrated
    try:
        book = DrawBook(store.db)
        assert book.rows() == [] and book.current() == {}
        book.note("o/p", "heldout", 100.0)
        book.note("o/p", "heldout", 200.0)  # the clock starts once
        assert [(r.draw, r.drawn_at) for r in book.rows("o/p")] == [(0, 100.0)]
        assert book.current() == {}  # draw 0 is no draw to load
        assert book.advance("o/p", "heldout", 0, "admin", 300.0)
        assert not book.advance("o/p", "heldout", 0, "other", 301.0)  # lost the race
        assert book.current() == {("o/p", "heldout"): 1}
        assert book.advance("o/p", "heldout", 1, "schedule", 400.0)
        assert book.advance("o/q", "dev", 0, "admin", 500.0)  # no row yet: inserted
        rows = {(r.pack, r.split): (r.draw, r.drawn_at, r.drawn_by) for r in book.rows()}
        assert rows == {
            ("o/p", "heldout"): (2, 400.0, "schedule"),
            ("o/q", "dev"): (1, 500.0, "admin"),
        }
    finally:
        store.close()
