"""The four session protocols `palaestra conformance` speaks, each as one small driver over
plain HTTP (httpx): palaestra's own `/v1`, OpenEnv's HTTP routes, the Open Reward
Standard's and NeMo Gym 0.7's resources-server routes. A driver answers what its protocol
has and says what it lacks (`has`), so a check it cannot run is not-applicable, not a fail.
Every reply comes back as it was (status and JSON); the checks judge them.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any, ClassVar

import httpx

PROTOCOLS = ("palaestra", "openenv", "ors", "nemo-gym")
COOKIE = "palaestra_nemo_gym"  # palaestra's NeMo Gym session cookie (a ghost one for misses)
# A valid OpenAI Responses object with no output: NeMo Gym's verify request needs one.
EMPTY_RESPONSE: dict[str, Any] = {
    "id": "resp_conformance",
    "created_at": 0,
    "model": "conformance",
    "object": "response",
    "output": [],
    "parallel_tool_calls": False,
    "tool_choice": "auto",
    "tools": [],
}


@dataclass
class Reply:
    """One HTTP answer: its status and JSON body (None when it was not JSON)."""

    status: int
    body: Any = None

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def brief(self) -> str:
        text = json.dumps(self.body)[:160] if self.body is not None else ""
        return f"{self.status} {text}".strip()


@dataclass
class Opened:
    reply: Reply
    sid: str | None = None  # the session's id, when it opened
    observation: Any = None  # its first observation, where the protocol returns one


def reply_of(response: httpx.Response) -> Reply:
    try:
        return Reply(response.status_code, response.json())
    except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
        return Reply(response.status_code, response.text[:500] or None)


def sse_events(text: str) -> dict[str, str]:
    """An SSE stream's events by name (the last of each name)."""
    events: dict[str, str] = {}
    for chunk in text.replace("\r\n", "\n").split("\n\n"):
        name, data = "message", []
        for line in chunk.split("\n"):
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].strip())
        if data:
            events[name] = "\n".join(data)
    return events


@dataclass
class Driver:
    """One protocol's session operations. `task` is `org/name[@ver]:id` (or a protocol's
    own name for it); `tool`/`arguments` the action a check takes."""

    http: httpx.AsyncClient
    task: str
    tool: str
    arguments: dict[str, Any]
    token: str | None = None
    has: ClassVar[frozenset[str]] = frozenset()  # of: seed, close, verify, request_id, state
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.token:
            self.headers = {"Authorization": f"Bearer {self.token}"}

    @property
    def pack(self) -> str:
        return self.task.partition(":")[0].partition("@")[0]

    def as_other(self, token: str) -> Driver:
        """The same driver under another token (for another token's close)."""
        other = type(self)(self.http, self.task, self.tool, self.arguments, token)
        other.__dict__.update({k: v for k, v in self.__dict__.items() if k.startswith("_")})
        return other

    async def open(
        self, seed: int | None = None, sid: str | None = None, conflict: bool = False
    ) -> Opened:
        """A new session (`seed` where the protocol takes one); with `sid`, a session under
        that id (again); `conflict` makes it differ from the one `sid` already names."""
        raise NotImplementedError

    async def act(
        self, sid: str, arguments: dict[str, Any] | None = None, request_id: str | None = None
    ) -> Reply:
        raise NotImplementedError

    async def verify(self, sid: str) -> Reply:
        raise NotImplementedError

    async def close(self, sid: str) -> Reply:
        raise NotImplementedError

    async def steps(self, sid: str) -> int | None:
        return None


class Palaestra(Driver):
    has: ClassVar[frozenset[str]] = frozenset({"seed", "close", "verify", "request_id", "state"})

    async def open(
        self, seed: int | None = None, sid: str | None = None, conflict: bool = False
    ) -> Opened:
        body: dict[str, Any] = {"task": self.task or None, "seed": seed, "episode_id": sid}
        got = reply_of(await self.http.post("/v1/episodes", json=body, headers=self.headers))
        if not got.ok:
            return Opened(got)
        return Opened(got, got.body["episode_id"], got.body.get("observation"))

    async def act(
        self, sid: str, arguments: dict[str, Any] | None = None, request_id: str | None = None
    ) -> Reply:
        action = {
            "tool": self.tool,
            "arguments": self.arguments if arguments is None else arguments,
        }
        return reply_of(
            await self.http.post(
                f"/v1/episodes/{sid}/step",
                json={"action": action, "request_id": request_id},
                headers=self.headers,
            )
        )

    async def verify(self, sid: str) -> Reply:
        return reply_of(await self.http.post(f"/v1/episodes/{sid}/verify", headers=self.headers))

    async def close(self, sid: str) -> Reply:
        return reply_of(await self.http.delete(f"/v1/episodes/{sid}", headers=self.headers))

    async def steps(self, sid: str) -> int | None:
        got = reply_of(await self.http.get(f"/v1/episodes/{sid}", headers=self.headers))
        return int(got.body["step_count"]) if got.ok else None


class OpenEnv(Driver):
    """OpenEnv's HTTP routes under the URL given (palaestra's door: `/openenv/{org}/{name}`).
    They are stateless as OpenEnv's are: no close and no request ids over HTTP."""

    has: ClassVar[frozenset[str]] = frozenset({"seed", "state"})

    async def open(
        self, seed: int | None = None, sid: str | None = None, conflict: bool = False
    ) -> Opened:
        body: dict[str, Any] = {"seed": seed}
        if self.task:  # palaestra's door reads it; another OpenEnv server may take none
            body["task"] = self.task
        if sid is not None:
            body["episode_id"] = sid
        got = reply_of(await self.http.post("reset", json=body, headers=self.headers))
        if not got.ok:
            return Opened(got)
        meta = got.body.get("metadata") or {}
        return Opened(got, meta.get("episode_id") or sid, got.body.get("observation"))

    async def act(
        self, sid: str, arguments: dict[str, Any] | None = None, request_id: str | None = None
    ) -> Reply:
        action = {
            "tool": self.tool,
            "arguments": self.arguments if arguments is None else arguments,
        }
        body = {"action": action, "episode_id": sid}
        return reply_of(await self.http.post("step", json=body, headers=self.headers))

    async def steps(self, sid: str) -> int | None:
        got = reply_of(
            await self.http.get("state", params={"episode_id": sid}, headers=self.headers)
        )
        count = got.body.get("step_count") if got.ok and isinstance(got.body, dict) else None
        return int(count) if isinstance(count, int) else None


class ORS(Driver):
    """The Open Reward Standard: a session is opened in two calls, a tool call's id is its
    request id, and the reward arrives with the call (no verify route)."""

    has: ClassVar[frozenset[str]] = frozenset({"close", "request_id"})

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.token:
            self.headers["X-API-Key"] = self.token

    def _sid(self, sid: str) -> dict[str, str]:
        return {**self.headers, "X-Session-ID": sid}

    async def open(
        self, seed: int | None = None, sid: str | None = None, conflict: bool = False
    ) -> Opened:
        if sid is None:
            made = await self.http.post("/create_session", headers=self.headers)
            if made.status_code != 200:
                return Opened(reply_of(made))
            sid = sse_events(made.text).get("task_id", "")
            if not sid:  # a 200 naming no session opened none
                return Opened(Reply(502, "/create_session's stream named no task_id"))
        body = {"env_name": self.pack, "task_spec": {"id": self.task}}
        got = reply_of(await self.http.post("/create", json=body, headers=self._sid(sid)))
        if not got.ok:
            return Opened(got)
        prompt = reply_of(await self.http.get(f"/{self.pack}/prompt", headers=self._sid(sid)))
        return Opened(got, sid, prompt.body if prompt.ok else None)

    async def act(
        self, sid: str, arguments: dict[str, Any] | None = None, request_id: str | None = None
    ) -> Reply:
        body = {
            "name": self.tool,
            "input": self.arguments if arguments is None else arguments,
            "task_id": request_id,
        }
        got = await self.http.post(f"/{self.pack}/call", json=body, headers=self._sid(sid))
        if got.status_code != 200:
            return reply_of(got)
        end = sse_events(got.text).get("end")
        answer = json.loads(end) if end else None
        if isinstance(answer, dict) and answer.get("ok") is False:
            return Reply(422, answer)  # the tool's failure, as ORS reports one
        return Reply(200, answer)

    async def close(self, sid: str) -> Reply:
        return reply_of(await self.http.post("/delete", headers=self._sid(sid)))


class NeMoGym(Driver):
    """NeMo Gym 0.7's resources-server routes: a caller-assigned session id, a session
    cookie, tools at `POST /{tool}`, verify with a Responses object, idempotent close."""

    has: ClassVar[frozenset[str]] = frozenset({"seed", "close", "verify"})

    def __post_init__(self) -> None:
        super().__post_init__()
        self._cookies: dict[str, dict[str, str]] = {}
        self._episodes: dict[str, dict[str, Any]] = {}

    async def _post(self, path: str, body: Any, cookies: dict[str, str] | None) -> httpx.Response:
        """A call with exactly `cookies` (the session's own), none kept from earlier ones."""
        headers = dict(self.headers)
        if cookies:
            headers["Cookie"] = "; ".join(f"{k}={v}" for k, v in cookies.items())
        self.http.cookies.clear()
        try:
            return await self.http.post(path, json=body, headers=headers)
        finally:
            self.http.cookies.clear()

    def seed_body(self, sid: str, episode: dict[str, Any], seed: int | None) -> dict[str, Any]:
        taskset, _, task_id = self.task.rpartition(":")
        return {
            "resources_session_id": sid,
            "episode_id": episode,
            "task_id": {"taskset": taskset or self.task, "task_id": task_id or self.task},
            "task_data": {} if seed is None else {"seed": seed},
        }

    async def open(
        self, seed: int | None = None, sid: str | None = None, conflict: bool = False
    ) -> Opened:
        sid = sid or f"conformance-{uuid.uuid4().hex[:12]}"
        episode = self._episodes.setdefault(sid, {"rollout_id": f"conf-{uuid.uuid4().hex[:12]}"})
        if conflict:  # the same id, another episode
            episode = {"rollout_id": f"conf-{uuid.uuid4().hex[:12]}"}
        got = await self._post("/seed_session", self.seed_body(sid, episode, seed), None)
        if got.status_code == 200:
            self._cookies.setdefault(sid, dict(got.cookies))
        reply = reply_of(got)
        named = reply.body.get("resources_session_id") if isinstance(reply.body, dict) else None
        if reply.ok and not isinstance(named, str):  # a 200 naming no session opened none
            return Opened(Reply(502, "the seed's reply named no resources_session_id"))
        return Opened(reply, named if reply.ok else None, named)

    async def act(
        self, sid: str, arguments: dict[str, Any] | None = None, request_id: str | None = None
    ) -> Reply:
        body = self.arguments if arguments is None else arguments
        return reply_of(await self._post(f"/{self.tool}", body, self._cookie(sid)))

    def _cookie(self, sid: str) -> dict[str, str]:
        """The session's cookie; for a session never seeded, one no seed set."""
        found = self._cookies.get(sid)
        return found if found is not None else {"session": uuid.uuid4().hex, COOKIE: "ghost"}

    async def verify(self, sid: str) -> Reply:
        body = {"responses_create_params": {"input": []}, "response": EMPTY_RESPONSE}
        return reply_of(await self._post("/verify", body, self._cookie(sid)))

    async def close(self, sid: str) -> Reply:
        episode = self._episodes.get(sid, {"rollout_id": "conf-never-seeded"})
        body = {"resources_session_id": sid, "episode_id": episode}
        return reply_of(await self._post("/close_session", body, self._cookies.get(sid)))


DRIVERS: dict[str, type[Driver]] = {
    "palaestra": Palaestra,
    "openenv": OpenEnv,
    "ors": ORS,
    "nemo-gym": NeMoGym,
}
