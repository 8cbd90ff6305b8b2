"""Harness episodes: check a reset's `options["harness"]`, start the harness in the
episode's sandbox, record its model calls, and say how it ended (docs/harness.md).

A host (server/local_host.py) calls two things at reset: `open` (before anything is made:
422 on bad options, 403 without the scope or for an endpoint off the operator's allow-list,
503 for a harness or an endpoint that is unavailable; then it opens the model session and
gives the sandbox spec with the gateway) and, once the episode exists, `launch` with an
`EpisodeHandle`: the harness's files are written into the sandbox and the harness runs in
the background until it exits or a limit stops it; then `handle.finish` verifies the
episode. A reset that fails after `open` calls `abort`. The runner reaches its episode only
through the handle: each model call is recorded with `handle.record`, as a step is.

How an episode ends (each is the final step record's `info["harness"]`):
- the harness exited, whatever its exit code: verified (a crash is the agent's 0);
- the session's call or token limit, or the wall limit: the harness is killed, the
  episode truncated and verified;
- a session fault (the endpoint died, a reply without token ids): killed, `void`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

import httpx
from pydantic import ValidationError

from palaestra.envs.base import Family
from palaestra.sandbox import AgentFault, Sandbox, SandboxError, SandboxSpec
from palaestra.sandbox.base import GATEWAY_PORT
from palaestra.sdk.errors import (
    ConflictError,
    InvalidActionError,
    PermissionDeniedError,
    UnavailableError,
)
from palaestra.sdk.failures import Failure, FailureKind
from palaestra.sdk.harness import (
    HARNESS_OPTION,
    LLM_CALL_TOOL,
    HarnessOptions,
    HarnessStatus,
    LlmCall,
)
from palaestra.sdk.models import Action, Limits, Observation, StepResponse
from palaestra.sdk.task import Task
from palaestra.server.auth import HARNESS, Principal
from palaestra.server.config import Settings
from palaestra.server.harness.registry import (
    HARNESS_DIR,
    INSTRUCTION_FILE,
    Bound,
    Harness,
    HarnessConfig,
    HarnessRegistry,
    Launch,
)
from palaestra.server.harness.replay import Replay, call_digest

if TYPE_CHECKING:
    from palaestra.server.harness.proxy import LlmSession, SessionProxy

log = logging.getLogger("palaestra.harness")

BASE_URL = f"http://127.0.0.1:{GATEWAY_PORT}/v1"  # the session proxy, inside the sandbox
END_TOOL = "harness_end"  # the action tool of a harness episode's final step record
KILL_GRACE_S = 10.0  # after the wall limit, how long the harness's exec may take to return
OUTPUT_TAIL = 4000  # characters of the harness's own output kept in the final record


@dataclass(frozen=True)
class Plan:
    """A checked `options["harness"]`: what to start, and its limits."""

    harness: Harness
    options: HarnessOptions
    config: HarnessConfig
    bound: Bound
    max_calls: int
    max_tokens: int


@dataclass
class Ending:
    """How a harness run ended: `void` (a fault's reason, `kind` its failure kind) or
    `truncated`, and why."""

    reason: str
    truncated: bool = False
    void: str | None = None
    kind: FailureKind | None = None
    status: int | None = None  # the failed endpoint's HTTP status, if it answered one
    agent_failure: Failure | None = None  # the harness's own account (Outcome): not void


class EpisodeHandle(Protocol):
    """What a harness run may do to its episode (its host makes the handle)."""

    @property
    def key(self) -> str: ...

    @property
    def limits(self) -> Limits: ...

    @property
    def started(self) -> float:
        """When the episode started (`time.monotonic`)."""
        ...

    @property
    def sandbox(self) -> Sandbox: ...

    @property
    def active(self) -> bool: ...

    def record(self, action: Action, reply: StepResponse, duration_s: float) -> None:
        """Append a step to the episode's trajectory, and count it."""
        ...

    async def finish(self, ending: Ending) -> None:
        """The harness stopped: verify the episode (or void it on a fault)."""
        ...

    async def keep_start(self) -> None:
        """Keep the workspace as the harness is about to find it: the start a checkpoint
        replays from (server/harness/replay.py)."""
        ...


@dataclass(eq=False)
class HarnessRun:
    """One harness episode's run: its session, status and background task."""

    plan: Plan
    key: str
    session: LlmSession | None = None
    status: HarnessStatus = field(default_factory=lambda: HarnessStatus(name="", state="starting"))
    handle: EpisodeHandle | None = None
    task: asyncio.Task[None] | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)
    instruction: str = ""
    output: str = ""  # the tail of what the harness printed
    captured: list[str] = field(default_factory=list)  # digest of each recorded call

    @property
    def running(self) -> bool:
        return not self.done.is_set()

    def snapshot(self) -> HarnessStatus:
        """The status with the session's counts brought up to date."""
        if self.session is not None:
            self.status.calls = self.session.calls
            self.status.completion_tokens = self.session.completion_tokens
        return self.status.model_copy()

    def final_info(self) -> dict[str, Any]:
        """What the final step record's `info` says of the run."""
        return {"harness": self.snapshot().model_dump(mode="json"), "harness_output": self.output}


class HarnessRunner:
    """The harness episodes of one host."""

    def __init__(
        self,
        settings: Settings,
        proxy: SessionProxy | None,
        registry: HarnessRegistry | None = None,
    ) -> None:
        self.settings = settings
        self.proxy = proxy
        self.registry = registry or HarnessRegistry()
        self._runs: set[HarnessRun] = set()

    # -- reset ----------------------------------------------------------------------------
    async def open(
        self,
        options: dict[str, Any],
        principal: Principal,
        family: Family,
        task: Task,
        spec: SandboxSpec | None,
        key: str,
    ) -> tuple[HarnessRun | None, SandboxSpec | None]:
        """A reset's harness run, its model session open (None: not a harness episode), and
        the episode sandbox's spec with the gateway (the sandbox reaches that session and
        nothing else) and the harness's binds."""
        plan = await self.plan(options, principal, family, task)
        if plan is None:
            return None, spec
        return self._prepare(plan, spec, key, principal.token_id)

    async def plan(
        self, options: dict[str, Any], principal: Principal, family: Family, task: Task
    ) -> Plan | None:
        """The checked harness option of a reset (None: not a harness episode)."""
        if HARNESS_OPTION not in options:
            return None
        principal.require(HARNESS, "a harness episode (it names a model endpoint)")
        raw = options[HARNESS_OPTION]
        if not isinstance(raw, dict):
            raise InvalidActionError(
                f"options.{HARNESS_OPTION} must be an object, got {type(raw).__name__}",
                code="invalid_harness",
            )
        try:
            opts = HarnessOptions.model_validate(raw)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or '<harness>'}: {e['msg']}"
                for e in exc.errors()
            )
            raise InvalidActionError(
                f"options.{HARNESS_OPTION}: {problems}", code="invalid_harness"
            ) from None
        harness = self.registry.get(opts.name)  # 422 listing the names
        config = harness.config(opts.config)
        endpoint = check_endpoint(opts.model_endpoint, self.settings)
        max_calls = _capped("max_calls", opts.max_calls, self.settings, "calls")
        max_tokens = _capped("max_tokens", opts.max_tokens, self.settings, "tokens")
        if family.sandbox_spec(task) is None:
            raise InvalidActionError(
                f"family {family.name!r} runs no sandbox for task {task.ref}: a harness needs "
                "one to run in; pick a task of a family with a sandbox (coding, terminal, ...)",
                code="invalid_harness",
            )
        if self.proxy is None:
            raise UnavailableError(
                "this server has no model session proxy (an in-process manager built without "
                "one); harness episodes need `palaestra serve`",
                code="harness_unavailable",
            )
        bound = harness.bound(self.settings)  # 503 naming how to install it
        await self._probe(endpoint)
        opts = opts.model_copy(update={"model_endpoint": endpoint})
        return Plan(harness, opts, config, bound, max_calls, max_tokens)

    async def _probe(self, endpoint: str) -> None:
        """503 naming the endpoint when it does not answer GET /models (a server error or
        no answer at all); the policy cannot cause this, so the reset is refused. Only the
        status is read (an endless body would hold the reset and the server's memory), within
        the timeout in all, and no proxy of the environment is used (the session proxy uses
        none either)."""
        url = endpoint.rstrip("/") + "/models"
        timeout = self.settings.harness_probe_timeout_s
        try:
            async with (
                asyncio.timeout(timeout),  # in all: httpx's bounds one read, not a drip
                httpx.AsyncClient(timeout=timeout, follow_redirects=False, trust_env=False) as c,
                c.stream("GET", url) as reply,
            ):
                pass
        except (httpx.HTTPError, TimeoutError) as exc:
            raise UnavailableError(
                f"the model endpoint {endpoint} does not answer (GET {url}: "
                f"{type(exc).__name__}: {exc}); start it or fix options.harness.model_endpoint",
                code="endpoint_unavailable",
                retryable=True,
            ) from None
        if reply.status_code >= 500:
            raise UnavailableError(
                f"the model endpoint {endpoint} answers GET {url} with HTTP {reply.status_code}",
                code="endpoint_unavailable",
                retryable=True,
            )

    def _prepare(
        self,
        plan: Plan,
        spec: SandboxSpec | None,
        key: str,
        owner: str,
        replay: Replay | None = None,
    ) -> tuple[HarnessRun, SandboxSpec]:
        """The run, its session open (answering `replay` first: a resume), and the spec."""
        assert self.proxy is not None and spec is not None  # plan() checked both
        if spec.network:
            raise InvalidActionError(
                "this task's sandbox has internet access; a harness runs only in a sandbox "
                "whose one way out is its model proxy",
                code="invalid_harness",
            )
        run = HarnessRun(plan=plan, key=key)
        run.status = HarnessStatus(name=plan.harness.name, state="starting")
        run.session = self.proxy.open(
            key,
            plan.options,
            owner=owner,
            max_calls=plan.max_calls,
            max_tokens=plan.max_tokens,
            on_call=lambda call: self._record_call(run, call),
            replay=replay,
        )
        if replay is not None:
            run.captured = [call_digest(c.model_dump(mode="json")) for c in replay.pending]
        spec = dataclasses.replace(
            spec, gateway=key, ro_binds=(*spec.ro_binds, *plan.bound.ro_binds)
        )
        return run, spec

    async def _stage(self, run: HarnessRun, box: Sandbox) -> None:
        """The instruction and the harness's own files, written into the episode sandbox."""
        launch = self._launch(run, box.spec.workdir, run.instruction)
        await box.write_file(f"{HARNESS_DIR}/{INSTRUCTION_FILE}", launch.instruction)
        for name, text in run.plan.harness.files(launch, run.plan.config).items():
            await box.write_file(f"{HARNESS_DIR}/{name}", text)
        run.instruction = launch.instruction

    def reopen(
        self, plan: Plan, spec: SandboxSpec | None, key: str, owner: str, replay: Replay
    ) -> tuple[HarnessRun, SandboxSpec]:
        """A checkpointed harness episode's run again, its session replaying the capture
        (server/checkpoint.py); `launch` starts it as at reset."""
        return self._prepare(plan, spec, key, owner, replay)

    async def abort(self, run: HarnessRun) -> None:
        """A reset that failed after `prepare`: the session is closed."""
        if self.proxy is not None:
            await self.proxy.close(run.key)

    def launch(
        self, run: HarnessRun, handle: EpisodeHandle, instruction: str
    ) -> asyncio.Task[None]:
        """Stage and start the harness on the episode `handle` reaches; `handle.finish` is
        called once, when it has stopped (not when killed by `stop`)."""
        run.handle, run.instruction = handle, instruction
        run.status.state = "running"
        run.task = asyncio.create_task(self._drive(run), name=f"harness-{handle.key}")
        self._runs.add(run)
        run.task.add_done_callback(lambda _: self._runs.discard(run))
        return run.task

    # -- while it runs --------------------------------------------------------------------
    @staticmethod
    def refuse_step(run: HarnessRun | None, episode_id: str) -> None:
        """A step of a harness episode: 409, the harness owns the loop."""
        if run is not None:
            raise ConflictError(
                f"episode {episode_id} runs harness {run.plan.harness.name!r}, "
                "which owns the loop: read GET /v1/episodes/{id}, POST …/verify to wait for "
                "its end and the verdict, or DELETE to stop it",
                code="harness_running",
            )

    @staticmethod
    def _record_call(run: HarnessRun, call: LlmCall) -> None:
        """Each model call as a step record, as it happens: the trajectory grows live."""
        handle = run.handle
        if handle is None or not handle.active:
            return  # a call that finished after its episode ended is not the episode's
        usage = call.usage.get("completion_tokens", len(call.completion_token_ids))
        text = f"model call {call.index}: {usage} completion tokens, {call.finish_reason}"
        reply = StepResponse(
            observation=Observation(text=text), info={"llm_call": call.model_dump(mode="json")}
        )
        handle.record(Action(tool=LLM_CALL_TOOL, arguments={}), reply, call.proxy_s)
        run.captured.append(call_digest(reply.info["llm_call"]))
        run.snapshot()

    async def _drive(self, run: HarnessRun) -> None:
        handle = run.handle
        assert handle is not None and run.session is not None
        box = handle.sandbox
        try:
            await handle.keep_start()
            await self._stage(run, box)
        except SandboxError as exc:
            await self._end_unstarted(run, f"sandbox failed while staging the harness: {exc}")
            return
        launch = self._launch(run, box.spec.workdir, run.instruction)
        argv = run.plan.harness.argv(launch, run.plan.config)
        env = run.plan.harness.env(launch, run.plan.bound)
        limits = handle.limits
        wall = max(1.0, limits.max_wall_s - (time.monotonic() - handle.started))
        job = asyncio.ensure_future(box.exec(argv, timeout=wall, env=env, cwd=box.spec.workdir))
        stop = asyncio.ensure_future(run.session.stopped.wait())
        ending: Ending
        try:
            limit = wall + KILL_GRACE_S
            await asyncio.wait({job, stop}, timeout=limit, return_when=asyncio.FIRST_COMPLETED)
            if not job.done():
                await _kill(job, box)
                ending = self._stopped(run) or Ending(
                    f"wall-time limit of {limits.max_wall_s:g} s reached; harness killed",
                    truncated=True,
                )
                run.status.state = "killed"
            else:
                ending = self._exited(run, job)
        except asyncio.CancelledError:  # stop(): closed, or the server shuts down
            await _kill(job, box)
            run.status.state = "killed"
            raise
        finally:
            stop.cancel()
            if self.proxy is not None:
                await self.proxy.close(run.key)
            run.snapshot()
            run.done.set()
        run.status.reason = ending.reason
        await handle.finish(ending)

    async def _end_unstarted(self, run: HarnessRun, fault: str) -> None:
        """The harness could not be staged (an infrastructure fault): its episode is void."""
        assert run.handle is not None
        if self.proxy is not None:
            await self.proxy.close(run.key)
        run.status.state, run.status.reason = "failed", fault
        run.snapshot()
        run.done.set()
        await run.handle.finish(Ending(fault, void=fault, kind=FailureKind.SANDBOX_FAILED))

    def _stopped(self, run: HarnessRun) -> Ending | None:
        """What the session stopped the harness for, if it did."""
        session = run.session
        assert session is not None
        replay = session.replay
        if session.diverged is None and replay is not None and replay.pending:
            session.diverged = (
                f"the harness stopped after {replay.done} of the capture's {replay.total} "
                "model calls"
            )
        if session.diverged is not None:
            why = f"the resumed harness diverged from its checkpoint: {session.diverged}"
            return Ending(why, void=why, kind=FailureKind.RESUME_FAILED)
        if session.fault is not None:
            why = f"the model endpoint failed: {session.fault}"
            kind, status = FailureKind.MODEL_FAILED, session.fault_status
            return Ending(why, void=session.fault, kind=kind, status=status)
        if session.limit is not None:
            return Ending(f"{session.limit}; harness killed", truncated=True)
        return None

    def _exited(self, run: HarnessRun, job: asyncio.Future[Any]) -> Ending:
        exc = job.exception()
        if exc is not None:
            run.status.state = "failed"
            if isinstance(exc, AgentFault):  # its own processes filled its sandbox
                return Ending(f"the harness could not go on: {exc.failure}: {exc}")
            if isinstance(exc, SandboxError):
                why = f"sandbox failed: {exc}"
                return Ending(why, void=why, kind=FailureKind.SANDBOX_FAILED)
            log.error("harness exec crashed", exc_info=exc)
            crashed = f"harness runner crashed ({exc!r})"
            kind = FailureKind.HARNESS_CRASHED
            return Ending("the harness runner crashed", void=crashed, kind=kind)
        result = job.result()
        run.status.exit_code = result.exit_code
        run.output = (result.stdout + result.stderr)[-OUTPUT_TAIL:]
        stopped = self._stopped(run)
        if stopped is not None:  # the harness exited because its calls were refused
            run.status.state = "killed"
            return stopped
        if result.timed_out:
            run.status.state = "killed"
            return Ending("wall-time limit reached; harness killed", truncated=True)
        own = run.plan.harness.outcome(result)
        if own is not None:
            run.status.state = "exited" if own.failure is None else "failed"
            return Ending(own.reason, agent_failure=own.failure)
        run.status.state = "exited"
        return Ending(f"the harness exited with code {result.exit_code}")

    async def stop(self, run: HarnessRun | None) -> None:
        """Kill the harness without ending the episode (the caller ends it); a harness
        that has stopped already is let finish its end (the verdict is being made)."""
        if run is None:
            return
        if run.task is not None and not run.task.done():
            if not run.done.is_set():
                run.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.shield(run.task) if run.done.is_set() else await run.task
        elif self.proxy is not None:
            await self.proxy.close(run.key)

    async def wait(self, run: HarnessRun | None) -> None:
        """Until the harness ended (at most its episode's wall limit, and a grace; past
        that it is killed)."""
        if run is None or run.handle is None:
            return
        left = run.handle.limits.max_wall_s - (time.monotonic() - run.handle.started)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(run.done.wait(), max(0.0, left) + 2 * KILL_GRACE_S)
        if run.task is not None and run.done.is_set():  # its end callback runs after `done`
            with contextlib.suppress(asyncio.CancelledError, Exception, TimeoutError):
                await asyncio.wait_for(asyncio.shield(run.task), KILL_GRACE_S * 6)
        if not run.done.is_set():
            await self.stop(run)

    async def aclose(self) -> None:
        for run in list(self._runs):
            await self.stop(run)
        if self.proxy is not None:
            await self.proxy.aclose()

    def _launch(self, run: HarnessRun, workdir: str, instruction: str) -> Launch:
        return Launch(
            workdir=workdir.rstrip("/") or "/",
            instruction=instruction,
            base_url=BASE_URL,
            model=run.plan.options.model,
        )


async def _kill(job: asyncio.Future[Any], box: Any) -> None:
    """Stop the harness's exec: cancelled, every process of it is killed (bwrap kills its
    jail; docker's processes are swept by the sandbox's `kill_all`)."""
    job.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await job
    kill_all = getattr(box, "kill_all", None)
    if kill_all is not None:
        with contextlib.suppress(Exception):
            await kill_all()


def _capped(name: str, value: int | None, settings: Settings, what: str) -> int:
    default = getattr(settings, f"harness_max_{what}")
    ceiling = getattr(settings, f"ceiling_harness_{what}")
    if value is None:
        return int(default)
    if value > ceiling:
        raise InvalidActionError(
            f"options.harness.{name}={value} is over this server's ceiling "
            f"ceiling_harness_{what}={ceiling}; send at most {ceiling}, or ask the operator "
            f"to raise PALAESTRA_CEILING_HARNESS_{what.upper()}",
            code="limit_over_ceiling",
        )
    return value


def check_endpoint(url: str, settings: Settings) -> str:
    """`url` when it is an http(s) URL whose host is on `harness_endpoints` and is not this
    server itself; 422 for a malformed one, 403 naming the setting for any other. Whitespace
    around it (a pasted URL's newline) is stripped; any inside, or a control character, is
    refused here: the probe and the proxy would each fail on it their own way (a 500)."""
    url = url.strip()
    if any(ord(c) <= 0x20 or 0x7F <= ord(c) <= 0x9F for c in url):
        raise InvalidActionError(
            f"options.harness.model_endpoint {url[:200]!r} holds a space or a control "
            "character; send the base URL alone, e.g. http://127.0.0.1:8001/v1",
            code="invalid_harness",
        )
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise InvalidActionError(
            f"options.harness.model_endpoint {url[:200]!r} is not a URL: {exc}",
            code="invalid_harness",
        ) from None
    host = (parts.hostname or "").lower()
    if parts.scheme not in ("http", "https") or not host:
        raise InvalidActionError(
            "options.harness.model_endpoint must be an http:// or https:// URL with a host, "
            f"e.g. http://127.0.0.1:8001/v1; got {url[:200]!r}",
            code="invalid_harness",
        )
    if parts.username is not None or parts.password is not None or parts.query or parts.fragment:
        raise InvalidActionError(
            "options.harness.model_endpoint takes no credentials, query or fragment; send the "
            "base URL alone, e.g. http://127.0.0.1:8001/v1",
            code="invalid_harness",
        )
    port = port or (443 if parts.scheme == "https" else 80)
    if _loopback(host) and port == settings.port:
        raise PermissionDeniedError(
            f"options.harness.model_endpoint {url[:200]!r} is this server itself; name the "
            "model server's own address",
            code="endpoint_forbidden",
        )
    if not _allowed(host, port, settings.harness_endpoints):
        raise PermissionDeniedError(
            f"the model endpoint host {host}:{port} is not on this server's allow-list "
            f"harness_endpoints={settings.harness_endpoints}; use one of those, or ask the "
            "operator to add it (PALAESTRA_HARNESS_ENDPOINTS)",
            code="endpoint_forbidden",
        )
    return url.rstrip("/")


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def _loopback(host: str) -> bool:
    ip = _ip(host)
    return host == "localhost" or (ip is not None and ip.is_loopback)


def _allowed(host: str, port: int, rules: list[str]) -> bool:
    """Whether `host:port` matches a rule (`host` or `host:port`; IPs compared as IPs, names
    literally: a name is never resolved here, so DNS cannot widen the list)."""
    ip = _ip(host)
    for rule in rules:
        rule_host, rule_port = rule.strip().lower(), None
        if rule_host.startswith("["):  # [v6]:port
            inner, _, rest = rule_host[1:].partition("]")
            rule_host, rule_port = inner, rest.lstrip(":") or None
        elif rule_host.count(":") == 1:
            rule_host, rule_port = rule_host.split(":")
        if rule_port is not None and rule_port != str(port):
            continue
        rule_ip = _ip(rule_host)
        if (ip is not None and rule_ip is not None and ip == rule_ip) or host == rule_host:
            return True
    return False
