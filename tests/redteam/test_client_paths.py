"""A confused deputy through the client: `palaestra eval regrade RUN` (and every SDK call
that names an episode) puts the episode id it read from a run directory into a URL path.
An id such as `../packs/org/name/enable?` climbed out of `/v1/episodes/` (httpx removes
dot segments) and cut the route off at the `?`: a run directory someone else wrote made
the reader's token POST to another route (enable, yank, rotate a pack). Ids are sent as
one path segment, so such an id only ever names an episode (an unknown one: 404).

No server: a transport that records what the client sends."""

from __future__ import annotations

from urllib.parse import unquote

import httpx
import pytest

from palaestra.sdk.errors import PalaestraError
from palaestra.sdk.http import AsyncHTTPClient

HOSTILE = [
    "../packs/org/name/enable?",
    "../../v1/packs/org/name@1.0/yank#",
    "..",
    ".",
    "a/../../tokens?x=",
    "x%2F..%2Ftokens",
]


@pytest.mark.parametrize("eid", HOSTILE)
@pytest.mark.parametrize("call", ["regrade", "fork", "checkpoint", "resume", "verify", "state"])
async def test_an_episode_id_never_leaves_its_path_segment(eid: str, call: str) -> None:
    seen: list[httpx.URL] = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request.url)
        return httpx.Response(404, json={"error": {"code": "not_found", "message": "no"}})

    http = httpx.AsyncClient(base_url="http://app", transport=httpx.MockTransport(record))
    client = AsyncHTTPClient("http://app", http=http)
    args: tuple[str, ...] = (eid, "org/name@2.0") if call == "regrade" else (eid,)
    with pytest.raises(PalaestraError):
        await getattr(client, call)(*args)
    await http.aclose()
    assert seen, "nothing sent"
    url = seen[0]
    assert url.query == b"" and url.fragment == ""
    raw = url.raw_path.decode()
    assert raw.startswith("/v1/episodes/"), raw
    segment = raw.removeprefix("/v1/episodes/").split("/")[0]
    assert segment not in (".", "..", "")
    assert unquote(segment) == eid
