"""Regrade through a cluster front (server/regrade.py does the work on a worker).

An episode's final state is kept where it was verified: in the data dir of the worker that
hosted it (each node has its own). So a front sends a regrade to that worker, found as
every call finds an episode's worker (its placement in the shared store), and the worker
regrades it with its own sandboxes and verifier. When that worker is gone its kept state
is gone with it: 409 `no_final_state` naming the worker.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from palaestra.sdk.models import RegradeRequest, Verdict
from palaestra.server.auth import Principal
from palaestra.server.cluster.worker import principal_json
from palaestra.server.regrade import no_final_state

if TYPE_CHECKING:
    from palaestra.server.cluster.front import ClusterHost


class ClusterRegrades:
    """A front's regrades, each on the worker that kept the episode's final state."""

    def __init__(self, host: ClusterHost) -> None:
        self.host = host

    async def regrade(
        self, principal: Principal, episode_id: str, request: RegradeRequest
    ) -> Verdict:
        host = self.host
        found = await host._route(principal, episode_id)
        if found is None:
            await host.stored.key(principal, episode_id)  # 404: not the caller's
            raise no_final_state(episode_id, "no worker ever hosted it")
        route = found[1]
        args = {
            "id": episode_id,
            "principal": principal_json(principal),
            "request": request.model_dump(mode="json"),
        }
        body = await host._call(route, "regrade", args)
        if body is None:
            await host.stored.key(principal, episode_id)  # 404: not the caller's
            raise no_final_state(
                episode_id, f"its final state was kept by worker {route.worker}, which is gone"
            )
        return Verdict.model_validate_json(body)
