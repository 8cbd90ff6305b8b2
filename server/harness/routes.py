"""`/v1/episodes/{id}/llm/…`: a harness episode's model session over the server's own HTTP,
for a harness that runs outside the sandbox (or a trainer checking a call by hand). The
OpenAI base URL (chat completions and Open Responses) is `…/llm/v1`, the Anthropic one
`…/llm`; the bearer token is the episode owner's (an Anthropic client sends it as
`auth_token`). Any other token, an unknown id and an episode without a session all get
the one 404 of an unknown episode (DESIGN §3).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from palaestra.server.caller import principal_of, services_of
from palaestra.server.episode import unknown_episode
from palaestra.server.harness.proxy import LlmSession
from palaestra.server.tenancy import candidate_keys

router = APIRouter(tags=["harness"])

PATH = "/v1/episodes/{episode_id}/llm/{path:path}"


def session_of(request: Request, episode_id: str) -> LlmSession | None:
    """The caller's own model session of `episode_id` (None for any other)."""
    principal = principal_of(request)
    proxy = services_of(request).sessions
    if proxy is None:
        return None
    for key in candidate_keys(principal.token_id, episode_id):
        session = proxy.get(key)
        if session is not None and session.owner == principal.token_id:
            return session
    return None


async def _answer(episode_id: str, path: str, request: Request) -> Response:
    session = session_of(request, episode_id)
    if session is None:
        error = unknown_episode(episode_id)
        return JSONResponse(error.to_json(), status_code=error.status)
    reply = await session.handle(request.method, "/" + path, await request.body())
    return Response(
        reply.body, reply.status, headers=dict(reply.headers), media_type=reply.content_type
    )


@router.post(PATH)
async def llm_call(episode_id: str, path: str, request: Request) -> Response:
    """A model call of the episode's harness, `v1/chat/completions` (OpenAI),
    `v1/messages` (Anthropic) or `v1/responses` (Open Responses), answered in that API's
    own shape, errors included."""
    return await _answer(episode_id, path, request)


@router.get(PATH)
async def llm_models(episode_id: str, path: str, request: Request) -> Response:
    """`v1/models`: the model the episode's reset named."""
    return await _answer(episode_id, path, request)
