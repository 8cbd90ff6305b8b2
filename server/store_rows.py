"""How the store writer's queued writes become statements: runs of one statement for
`executemany`, step records chunked a run of an episode's steps to a row, and step rows
STEP_ROWS to a multi-row INSERT (server/store.py's writer executes them)."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

# A queued write: (statement, parameters, the future its caller may wait on or None, and for
# a step record who owns its episode and its size: what the writer's backlog holds of each
# token's)
Write = tuple[str, tuple[Any, ...], "Future[None] | None", "tuple[str, int] | None"]

_STEP_UPSERT = (
    " ON CONFLICT (episode, idx) DO UPDATE"
    " SET request_id=excluded.request_id, record=excluded.record"
)
_STEP_INSERT = "INSERT INTO step_records (episode, idx, request_id, record) VALUES "
ADD_STEP = _STEP_INSERT + "(?,?,?,?)" + _STEP_UPSERT
# Step records go in STEP_ROWS to a statement: the driver gives the GIL back while the
# database works, once a statement; one a row made the writer queue behind a busy event loop
# for the GIL on every row (it fell minutes behind a batch-stepping trainer).
STEP_ROWS = 128
STEP_BYTES = 1 << 20  # what one statement's records bind at most
ADD_STEPS = _STEP_INSERT + ",".join(["(?,?,?,?)"] * STEP_ROWS) + _STEP_UPSERT
CHUNK_BYTES = STEP_BYTES // STEP_ROWS  # one row's records at most (and records chunked)


def runs(batch: list[Write]) -> list[tuple[str, list[tuple[Any, ...]]]]:
    """Consecutive writes of one statement grouped for `executemany` (order kept)."""
    runs: list[tuple[str, list[tuple[Any, ...]]]] = []
    for sql, params, _, _ in batch:
        if runs and runs[-1][0] == sql:
            runs[-1][1].append(params)
        else:
            runs.append((sql, [params]))
    return runs


def _chunked(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Step rows with one row per run of an episode's consecutive steps (a chunk): a JSON
    array of their records at the first's index, their request ids joined by newlines
    (`store_reads.expand`). A row costs the database about as much as 300 bytes of record,
    so a trainer's batch of many episodes stepped a few times a commit costs a third.
    Records over CHUNK_BYTES stay alone; an index seen before in the run ends the chunk."""
    chains: dict[int, list[Any]] = {}  # episode -> its open chunk: [bytes, rows...]
    out: list[tuple[Any, ...] | list[Any]] = []
    for row in rows:
        episode, index, _, record = row
        size = len(record)
        chain = chains.get(episode)
        if chain is not None and chain[-1][1] + 1 == index and chain[0] + size <= CHUNK_BYTES:
            chain.append(row)
            chain[0] += size
        elif size > CHUNK_BYTES:
            chains.pop(episode, None)
            out.append(row)
        else:
            chain = chains[episode] = [size, row]
            out.append(chain)
    return [_chunk_row(one[1:]) if isinstance(one, list) else one for one in out]


def _chunk_row(chain: list[tuple[Any, ...]]) -> tuple[Any, ...]:
    if len(chain) == 1:
        return chain[0]
    ids = [row[2] for row in chain]
    joined = None if all(i is None for i in ids) else "\n".join(i or "" for i in ids)
    return (chain[0][0], chain[0][1], joined, "[" + ",".join(row[3] for row in chain) + "]")


def statements(sql: str, rows: list[tuple[Any, ...]]) -> list[tuple[str, list[tuple[Any, ...]]]]:
    """A run of one statement's rows as (statement, its parameters) to execute in order: step
    records STEP_ROWS to an ADD_STEPS statement, while they are small; a record over
    STEP_BYTES / STEP_ROWS, and what is left over, one to a row (binding is done holding the
    GIL: a statement of large ones would hold the event loop while it is bound). Order is
    kept: a step index written twice ends as its last write."""
    if sql is not ADD_STEP:
        return [(sql, rows)]
    rows = _chunked(rows)
    out: list[tuple[str, list[tuple[Any, ...]]]] = []
    small: list[tuple[Any, ...]] = []

    def single(some: list[tuple[Any, ...]]) -> None:
        if out and out[-1][0] is ADD_STEP:
            out[-1][1].extend(some)
        else:
            out.append((ADD_STEP, list(some)))

    for row in rows:
        if len(row[3]) > STEP_BYTES // STEP_ROWS:
            single([*small, row])
            small = []
            continue
        small.append(row)
        if len(small) == STEP_ROWS:
            statement = tuple(value for one in small for value in one)
            if out and out[-1][0] is ADD_STEPS:
                out[-1][1].append(statement)
            else:
                out.append((ADD_STEPS, [statement]))
            small = []
    if small:
        single(small)
    return out
