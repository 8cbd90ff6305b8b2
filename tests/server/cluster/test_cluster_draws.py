"""Held-out draws in cluster mode (server/draws.py): a rotation through one front is served
by the workers (a worker sent a task of a draw it lacks loads the draws first) and by the
other front within `heldout_sync_s`, which then refuses the retired draw too. A real local
3-node Ray cluster behind two real `palaestra serve --ray` fronts (test_cluster.py's
fixture), the built-in cad pack's sealed generated split."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.pg import PostgresServer
from tests.server.cluster.test_cluster import Ctx, authenticated_cluster
from tests.servers import wait_until

pytestmark = pytest.mark.slow

pytest.importorskip("ray", reason="cluster mode needs ray (the bootstrap installs it)")

CAD = "palaestra/cad"


@pytest.fixture(scope="module")
def ctx(pg_server: PostgresServer) -> Iterator[Ctx]:
    from palaestra.server.cluster import rayauth

    with pytest.MonkeyPatch.context() as patch:
        yield from authenticated_cluster(pg_server, patch)
    rayauth.reload_ray_config()


def heldout(ctx: Ctx, front: int) -> set[str]:
    reply = ctx.call(
        front, "GET", "/v1/tasks", params={"pack": CAD, "split": "heldout", "limit": 1000}
    )
    assert reply.status_code == 200, reply.text
    return {t["id"] for t in reply.json()["tasks"]}


def test_a_rotation_reaches_workers_and_the_other_front(ctx: Ctx) -> None:
    before = heldout(ctx, 0)
    assert heldout(ctx, 1) == before and len(before) == 360
    rotated = ctx.call(0, "POST", f"/v1/packs/{CAD}/heldout/rotate")
    assert rotated.status_code == 200, rotated.text
    after = heldout(ctx, 0)
    assert len(after) == 360 and not after & before
    # Every worker serves the new draw (each loads it when first sent one of its tasks).
    workers = set()
    for ref in sorted(after)[:6]:  # one at a time: a cad episode takes a CPU of a node
        reply = ctx.reset(task=ref, split=None, pack=None)
        assert reply.status_code == 200, reply.text
        assert reply.json()["info"]["heldout_draw"] == 1
        workers.add(reply.json()["info"]["worker"])
        ctx.close(0, reply.json()["episode_id"])
    assert workers
    # The other front follows within heldout_sync_s, and refuses the retired draw.
    wait_until(lambda: heldout(ctx, 1) == after, base_s=60, what="the other front's draw")
    old = ctx.reset(1, task=sorted(before)[0], split=None, pack=None)
    assert old.status_code == 404 and old.json()["error"]["code"] == "draw_retired"
