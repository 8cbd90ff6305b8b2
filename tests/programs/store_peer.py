"""A second process on a store (tests/server/test_store_engines.py): reads what the test wrote,
then writes episodes of its own while the test keeps writing.

    python store_peer.py STORE_URL COUNT   # prints the step count it read of episode a-0
"""

from __future__ import annotations

import sys
import time

from palaestra.sdk.models import Action, EpisodeState, Observation, StepRecord
from palaestra.server.db import Database
from palaestra.server.store import Store

target, count = sys.argv[1], int(sys.argv[2])
store = Store(Database.open(target))
seen = store.reads.load_episode("a-0")
print(len(seen.trajectory) if seen else -1, flush=True)
now = time.time()
for i in range(count):
    eid = f"b-{i}"
    number = store.create_episode(
        EpisodeState(
            episode_id=eid,
            task="t",
            family="echo",
            domain="echo/say",
            split="train",
            status="active",
            step_count=0,
            created_at=now,
            updated_at=now,
        ),
        "sha256:x",
        False,
    ).number
    for idx in range(5):
        record = StepRecord(index=idx, action=Action(tool="echo"), observation=Observation())
        store.add_step(number, idx, f"r{idx}", record.model_dump_json())
store.close()
