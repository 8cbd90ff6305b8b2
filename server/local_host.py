"""The local host: episodes and their sandboxes in this process (server/host.py).

The embedded server runs one behind its front; each cluster worker runs one. Rules it keeps:
- a step with a `request_id` seen before returns the stored result; it never steps twice;
- a malformed action is refused (422) and the episode goes on;
- an infrastructure fault (sandbox died, verifier or family crashed) ends the episode
  `void`, never with reward 0;
- the verdict's reward arrives with the step that ends the episode;
- idle episodes expire after a TTL and their sandboxes are freed at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from typing import Any

from palaestra.envs.base import EpisodeContext, StepOutcome
from palaestra.sandbox import AgentFault, Sandbox, SandboxError
from palaestra.sdk.errors import CapacityError, ConflictError, InvalidActionError, UnavailableError
from palaestra.sdk.failures import Failure, FailureKind
from palaestra.sdk.models import (
    Action,
    EpisodeState,
    EpisodeStatus,
    ForkResponse,
    Limits,
    Observation,
    ResetResponse,
    StepRequest,
    StepResponse,
    Verdict,
    step_record_json,
)
from palaestra.server.auth import ADMIN, Principal
from palaestra.server.checkpoint import Checkpoints
from palaestra.server.episode import (
    Episode,
    assess,
    id_taken,
    log_crash,
    sandbox_fault,
    void_verdict,
)
from palaestra.server.final_state import FinalStates
from palaestra.server.fork import fork_episode, fork_reply, stored_ended
from palaestra.server.harness.runner import END_TOOL, HarnessRunner
from palaestra.server.harness.runner import Ending as HarnessEnding
from palaestra.server.host import Accounting, Ending, ForkOrder, StartOrder
from palaestra.server.sandboxes import SandboxOwner
from palaestra.server.services import Services
from palaestra.server.stored_episodes import StoredEpisodes
from palaestra.server.tenancy import candidate_keys

log = logging.getLogger("palaestra.episodes")

ENDED_CACHE = 4096


class LocalHost:
    """Live episodes of this process. `node`: the cluster worker's name (None: the embedded
    server, which owns every active episode in its store)."""

    def __init__(
        self,
        services: Services,
        sandboxes: SandboxOwner,
        accounting: Accounting,
        *,
        node: str | None = None,
    ) -> None:
        self.settings = services.settings
        self.store = services.store
        self.families = services.families
        self.judges = services.judges
        self.sandboxes = sandboxes
        self.accounting = accounting
        self.metrics = metrics = services.metrics
        self.node = node
        self.harness = HarnessRunner(services.settings, services.sessions)
        self.stored = StoredEpisodes(services.store)
        self.checkpoints = Checkpoints(self, services.packs)  # checkpoint, resume (its module)
        self.final_states = FinalStates(services.settings, services.store)  # for regrading
        self._live: dict[str, Episode] = {}
        self._ended: OrderedDict[str, Episode] = OrderedDict()
        self._pending = 0
        self._reserved: set[str] = set()  # keys of episodes being started
        self._detached: set[asyncio.Future[Any]] = set()  # harness runs
        self._open = False
        metrics.bind_live(self._live_by_status, lambda: self.sandboxes.live_count)

    # -- lifecycle ------------------------------------------------------------------------
    async def open(self) -> None:
        if self.node is None:
            await self.checkpoints.at_start()  # checkpointed ones become resumable, not void
            restarted = Failure.of(FailureKind.SERVER_SHUTDOWN, "server restarted")
            voided = await self.store.mark_unfinished(
                EpisodeStatus.VOID.value, restarted.reason, time.time(), restarted
            )
            if voided:
                log.warning("marked %d episodes left active by a previous server as void", voided)
        else:  # other workers' episodes are alive: only this worker's are its previous run's
            stale = await self.store.active_on(self.node)
            if stale:
                log.warning("%s: %d episodes of its previous run lost", self.node, len(stale))
        self._open = True

    async def aclose(self) -> None:
        self._open = False
        for work in list(self._detached):
            work.cancel()
        await asyncio.gather(*self._detached, return_exceptions=True)
        await self.harness.aclose()
        for episode in list(self._live.values()):
            if await self.checkpoints.park(episode):  # resumable by the next server
                continue
            shutdown = Failure.of(FailureKind.SERVER_SHUTDOWN, "server shut down")
            await self._end(episode, EpisodeStatus.VOID, shutdown)
        await self.sandboxes.aclose()

    @property
    def ready(self) -> bool:
        return self._open

    @property
    def live_count(self) -> int:
        return len(self._live) + self._pending

    def holds(self, key: str) -> bool:
        """Whether the episode under `key` is live here."""
        return key in self._live

    def _live_by_status(self) -> dict[str, int]:
        return {EpisodeStatus.ACTIVE.value: len(self._live)}

    async def exposition(self, own: bytes) -> bytes:
        return own

    # -- episodes -------------------------------------------------------------------------
    async def start(self, order: StartOrder) -> ResetResponse:
        if len(self._live) + self._pending >= self.settings.max_episodes:
            raise CapacityError(
                f"the server holds its limit of {self.settings.max_episodes} live episodes; "
                "close finished episodes or retry later",
                retry_after=1.0,
            )
        task, request, principal, key = order.task, order.request, order.principal, order.key
        if key in self._live or key in self._ended or key in self._reserved:
            raise id_taken(request.episode_id or key)
        owner = principal.token_id
        family = self.families.get(task.family)
        self._reserved.add(key)
        self._pending += 1
        try:
            # also taken when stored by an earlier server
            if request.episode_id and await self.store.owners((key,)):
                raise id_taken(request.episode_id)
            sandboxes = self.sandboxes.for_episode(family, task)
            ctx = EpisodeContext(
                episode_id=key,
                task=task,
                seed=request.seed,
                options=request.options,
                sandboxes=sandboxes,
                judges=self.judges,
            )
            # a harness episode's sandbox reaches its model session alone
            run, spec = await self.harness.open(
                request.options, principal, family, task, family.sandbox_spec(task), key
            )
            try:
                await self.sandboxes.start(sandboxes, spec)
                observation = await family.reset(ctx)
            except BaseException as exc:
                await self.sandboxes.free(sandboxes)  # whatever it made before the fault
                if run is not None:
                    await self.harness.abort(run)
                if isinstance(exc, SandboxError):
                    raise UnavailableError(
                        f"the sandbox failed while starting the episode: {exc}",
                        code="sandbox_failed",
                    ) from None
                raise
        finally:
            self._pending -= 1
            self._reserved.discard(key)
        now = time.time()
        state = EpisodeState(
            episode_id=key,
            task=task.ref,
            family=task.family,
            domain=task.domain,
            split=task.split,
            status=EpisodeStatus.ACTIVE,
            step_count=0,
            created_at=now,
            updated_at=now,
        )
        row = self.store.create_episode(state, task.digest, task.sealed, owner=owner)
        mono = time.monotonic()
        episode = Episode(
            number=row.number,
            step_timer=self.metrics.step_seconds.labels(task.family),
            task=task,
            family=family,
            ctx=ctx,
            limits=order.limits,
            state=state,
            started=mono,
            last_active=mono,
            oracle=family.oracle(task) if order.oracle else None,
            owner=owner,
            harness=run,
        )
        self._live[key] = episode
        await self.store.commit()  # an episode a client was told of survives a crash
        info: dict[str, Any] = {}
        if run is not None:
            self.launch_harness(episode, observation.text)
            info["harness"] = run.snapshot().model_dump(mode="json")
        self.metrics.episodes_started.labels(family=task.family).inc()
        log.info("episode started", extra={"episode_id": key, "task_digest": task.digest})
        return ResetResponse(
            episode_id=request.episode_id or key,
            observation=observation,
            tools=family.tool_specs(),
            limits=order.limits,
            info=info,
        )

    def launch_harness(self, episode: Episode, instruction: str) -> None:
        """Start a harness episode's harness (at reset, or replaying at a resume)."""
        assert episode.harness is not None
        handle = HarnessHandle(self, episode)
        self._keep(self.harness.launch(episode.harness, handle, instruction))

    def _keep(self, work: asyncio.Future[Any]) -> None:
        """Hold a reference to background work until it is done; cancelled at close."""
        self._detached.add(work)
        work.add_done_callback(self._detached.discard)

    async def step(
        self, principal: Principal, episode_id: str, request: StepRequest
    ) -> StepResponse:
        episode = self._find(episode_id, principal)
        if episode is None:
            key = await self.stored.key(principal, episode_id)
            return await self.stored.step(key, episode_id, request.request_id)
        if ADMIN not in principal.scopes:
            principal.require_episodes(episode.task.sealed, episode.task.split)
        if not episode.lock.try_acquire():  # held: wait (free, the usual: no coroutine)
            await episode.lock.acquire()
        try:
            if request.request_id and request.request_id in episode.request_ids:
                cached = episode.replies.get(request.request_id)
                if cached is not None:
                    return cached
                stored = await self.store.find_step(episode.id, request.request_id)
                if stored is not None:
                    return stored
            if episode.state.status is not EpisodeStatus.ACTIVE:
                status = episode.state.status.value
                raise ConflictError(f"episode {episode_id} has ended ({status}); start a new one")
            if episode.harness is not None:  # 409: it owns the loop
                self.harness.refuse_step(episode.harness, episode_id)
            self.accounting.before_step(principal)  # 429 while over its CPU-seconds per hour
            started = time.perf_counter()
            episode.last_active = time.monotonic()
            try:
                action, recorded = episode.resolve_action(request.action)
                tool, args = episode.family.parse_action(action)
                reply, outcome = await self._run_step(episode, tool, args)
            except InvalidActionError:
                episode.tally.add_refused()
                raise
            finally:
                metered = episode.meter()
                spent = time.perf_counter() - started if metered is None else metered
                self.accounting.charged(episode.owner, spent)
            episode.count_step(reply, outcome)
            if reply.terminated or reply.truncated:
                reply.info["metrics"] = episode.settled_state().metrics.model_dump(mode="json")
            duration = time.perf_counter() - started
            episode.step_timer.observe(duration)
            self.record(episode, recorded, reply, duration, request.request_id)
            if self.store.behind(episode.owner):  # its records lag on disk: wait for them
                await self.store.catch_up(episode.owner)
            if request.request_id:
                episode.remember(request.request_id, reply)
            if reply.terminated or reply.truncated:
                self.store.update_episode(episode.settled_state())
                # The client learns that the episode ended only once it is on disk.
                await self.store.commit()
            return reply
        finally:
            episode.lock.release()

    def record(
        self,
        episode: Episode,
        action: Action,
        reply: StepResponse,
        duration_s: float,
        request_id: str | None = None,
    ) -> None:
        """Append a step to the episode's trajectory and count it: the one path of ordinary
        steps, a harness's model calls and its final record alike. The trajectory lives in
        the store only: it can be large, and a live copy of every step would be walked by
        every garbage collection."""
        state, now = episode.state, time.time()
        index = state.step_count
        record = step_record_json(
            index=index,
            request_id=request_id,
            action=action,
            observation=reply.observation,
            reward=reply.reward,
            terminated=reply.terminated,
            truncated=reply.truncated,
            info=reply.info,
            duration_s=duration_s,
            at=now,
        )
        self.store.add_step(episode.number, index, request_id, record, episode.owner)
        # Both are required fields (always among the set ones) of a model that validates no
        # assignment: written as its __setattr__ would, without its two calls a step.
        state.__dict__.update(step_count=index + 1, updated_at=now)
        self.checkpoints.auto(episode)  # every checkpoint_every_steps, in the background

    async def _run_step(
        self, episode: Episode, tool: Any, args: Any
    ) -> tuple[StepResponse, StepOutcome | None]:
        """The reply, and the family's outcome (None: the step never reached the family, or
        the episode went void)."""
        if time.monotonic() - episode.started > episode.limits.max_wall_s:
            text = f"wall-time limit of {episode.limits.max_wall_s:g} s reached"
            return await self._finish(episode, Observation(text=text), truncated=True), None
        try:
            outcome = await episode.family.step(episode.ctx, tool, args)
        except InvalidActionError:
            raise
        except AgentFault as exc:  # a path or file the agent made (before SandboxError)
            raise InvalidActionError(str(exc), code=exc.failure) from None
        except SandboxError as exc:
            fault = await sandbox_fault(episode)  # the agent's own sandbox state?
            if fault is not None:
                raise InvalidActionError(str(fault), code=fault.failure) from None
            failed = f"sandbox failed: {exc}"
            return await self._void(episode, failed, FailureKind.SANDBOX_FAILED), None
        except Exception as exc:
            log_crash(episode, f"family {episode.family.name} crashed in step", exc)
            reason = f"the environment crashed ({type(exc).__name__})"
            return await self._void(episode, reason, FailureKind.ENV_CRASHED), None
        if outcome.done:
            reply = await self._finish(
                episode, outcome.observation, terminated=True, info=outcome.info
            )
            return reply, outcome
        if episode.state.step_count + 1 >= episode.limits.max_steps:
            obs = outcome.observation.model_copy()
            obs.text += f"\n[step limit of {episode.limits.max_steps} reached]"
            reply = await self._finish(episode, obs, truncated=True, info=outcome.info)
            return reply, outcome
        return StepResponse(observation=outcome.observation, info=outcome.info), outcome  # copied

    async def _finish(
        self,
        episode: Episode,
        observation: Observation,
        *,
        terminated: bool = False,
        truncated: bool = False,
        info: dict[str, Any] | None = None,
    ) -> StepResponse:
        verdict = await self._verify(episode)
        out = dict(info or {})
        out.update(status=episode.state.status.value, verdict=verdict.model_dump(mode="json"))
        failure = episode.state.failure
        out["failure"] = None if failure is None else failure.model_dump(mode="json")
        return StepResponse(
            observation=observation,
            reward=verdict.reward,
            terminated=terminated,
            truncated=truncated,
            info=out,
        )

    async def _void(
        self,
        episode: Episode,
        reason: str,
        kind: FailureKind,
        exit_code: int | None = None,
        status: int | None = None,
    ) -> StepResponse:
        failure = Failure.of(kind, reason, exit_code=exit_code, status=status)
        await self._end(episode, EpisodeStatus.VOID, failure)
        verdict = void_verdict(episode.task.digest, reason, 0.0, kind)
        episode.state.verdict = verdict
        self.store.put_verdict(episode.id, verdict)
        return StepResponse(
            observation=Observation(text=f"episode void: {reason}"),
            terminated=True,
            info={
                "status": "void",
                "void_reason": reason,
                "verdict": verdict.model_dump(mode="json"),
                "failure": failure.model_dump(mode="json"),
            },
        )

    async def _verify(self, episode: Episode) -> Verdict:
        """Verify once; the verdict is cached on the episode and stored."""
        if episode.state.verdict is not None:
            return episode.state.verdict
        await self.final_states.keep(episode)  # what the verifier sees, for regrading
        started = time.perf_counter()
        verdict, status, failure = await assess(episode)
        self.metrics.verify_seconds.labels(episode.task.family).observe(
            time.perf_counter() - started
        )
        episode.state.timings["verify_s"] = round(time.perf_counter() - started, 6)
        episode.state.verdict = verdict
        self.store.put_verdict(episode.id, verdict)
        await self._end(episode, status, failure)
        return verdict

    async def _end(
        self, episode: Episode, status: EpisodeStatus, failure: Failure | None = None
    ) -> None:
        """End the episode with `status`; `failure` (sdk/failures.py) says why it failed, and
        its reason is the void or expiry reason."""
        if episode.state.status is not EpisodeStatus.ACTIVE:
            return
        now = time.time()
        ended = status in (EpisodeStatus.VOID, EpisodeStatus.EXPIRED)
        reason = failure.reason if failure is not None and ended else None
        episode.state.status = status
        episode.state.ended_at = now
        episode.state.updated_at = now
        episode.state.void_reason = reason if status is EpisodeStatus.VOID else None
        episode.state.failure = failure
        episode.state.timings["wall_s"] = round(time.monotonic() - episode.started, 6)
        self._live.pop(episode.id, None)
        self._ended[episode.id] = episode
        episode.replies.clear()  # retries of an ended episode's steps come from the store
        if len(self._ended) > ENDED_CACHE:
            self._ended.popitem(last=False)
        self.metrics.episodes_ended.labels(status=status.value).inc()
        if failure is not None:
            self.metrics.episode_failures.labels(failure.kind.value, failure.boundary.value).inc()
        verdict = episode.state.verdict
        self.accounting.ended(
            Ending(
                key=episode.id,
                owner=episode.owner,
                task=episode.task.ref,
                status=status.value,
                reward=verdict.reward if verdict is not None else 0.0,
                passed=verdict.passed if verdict is not None else False,
                reason=reason,
                at=now,
            )
        )
        self.store.update_episode(episode.settled_state())
        self.accounting.charged(episode.owner, episode.meter() or 0.0)  # what verify used
        await self.sandboxes.free(episode.ctx.sandboxes)
        log.info(
            "episode ended: %s",
            status.value,
            extra={"episode_id": episode.id, "task_digest": episode.task.digest},
        )

    async def verify(self, principal: Principal, episode_id: str) -> Verdict:
        """Verify now (ending the episode if it is still active), or return the stored verdict."""
        episode, key = await self.owned(principal, episode_id)
        if episode is None:
            return await self.stored.verdict(key, episode_id)
        await self.harness.wait(episode.harness)  # a harness's end verifies its episode
        async with episode.lock:
            if episode.state.verdict is not None:
                return episode.state.verdict
            if episode.state.status is not EpisodeStatus.ACTIVE:
                raise ConflictError(
                    f"episode {episode_id} ended ({episode.state.status.value}) unverified"
                )
            verdict = await self._verify(episode)
            self.store.update_episode(episode.settled_state())
            await self.store.commit()
            return verdict

    async def state(self, principal: Principal, episode_id: str) -> EpisodeState:
        episode, key = await self.owned(principal, episode_id)
        if episode is None:
            return await self.stored.load(key, episode_id)
        # Live episodes keep no trajectory in memory (it can be large; the store has it).
        async with episode.lock:
            state = episode.settled_state().model_copy()
            if episode.harness is not None:
                state.harness = episode.harness.snapshot()
            if principal.is_admin:  # the operator may read a sealed verifier's own words
                state.sealed_feedback = episode.full_feedback
        state.trajectory = await self.store.load_steps(key, state.step_count)
        state.episode_id = episode_id  # the id the caller knows it by
        return state

    async def close(self, principal: Principal, episode_id: str) -> None:
        episode, _ = await self.owned(principal, episode_id)  # 404: not the caller's
        if episode is None:
            return  # stored, so ended: closing twice is fine
        await self.harness.stop(episode.harness)  # a harness is killed; no verdict
        async with episode.lock:
            await self._end(episode, EpisodeStatus.CLOSED)

    async def fork(self, order: ForkOrder) -> ForkResponse:
        """A copy of a live episode under `order.key`, the parent unchanged (server/fork.py)."""
        parent, key = await self.owned(order.principal, order.parent_id)  # 404: not the caller's
        if parent is None:  # only the store has it: it has ended
            raise await stored_ended(self.store, key, order.parent_id)
        if len(self._live) + self._pending >= self.settings.max_episodes:
            raise CapacityError("the server holds its limit of live episodes", retry_after=1.0)
        if order.key in self._live or order.key in self._ended or order.key in self._reserved:
            raise id_taken(order.request.episode_id or order.key)
        self._reserved.add(order.key)
        self._pending += 1
        try:
            child = await fork_episode(self, parent, order)
        finally:
            self._pending -= 1
            self._reserved.discard(order.key)
        self._live[order.key] = child
        await self.store.commit()  # a fork a client was told of survives a crash
        return fork_reply(child, order)

    async def harness_ended(self, episode: Episode, ending: HarnessEnding) -> None:
        """A harness stopped (server/harness/runner.py): verify, or void on a fault; the
        final step record says how it ended."""
        async with episode.lock:
            if episode.state.status is not EpisodeStatus.ACTIVE or episode.harness is None:
                return
            if ending.void is not None:
                kind = ending.kind or FailureKind.HARNESS_CRASHED
                exit_code = episode.harness.status.exit_code
                reply = await self._void(episode, ending.void, kind, exit_code, ending.status)
            else:
                obs, cut = Observation(text=ending.reason), ending.truncated
                reply = await self._finish(episode, obs, terminated=not cut, truncated=cut)
                self._harness_failure(episode, ending, reply)
            reply.info.update(episode.harness.final_info())
            self.record(episode, Action(tool=END_TOOL, arguments={}), reply, 0.0)
            self.store.update_episode(episode.settled_state())
            await self.store.commit()

    @staticmethod
    def _harness_failure(episode: Episode, ending: HarnessEnding, reply: StepResponse) -> None:
        """A harness that broke down (an ACP agent that broke the protocol) and did not
        pass: its typed agent failure is the episode's (a 0, never void)."""
        verdict = episode.state.verdict
        if ending.agent_failure is None or verdict is None or verdict.passed:
            return
        episode.state.failure = ending.agent_failure
        reply.info["failure"] = ending.agent_failure.model_dump(mode="json")

    # -- helpers --------------------------------------------------------------------------
    async def owned(self, principal: Principal, episode_id: str) -> tuple[Episode | None, str]:
        """The live (or recently ended) episode `episode_id` names for `principal` (else
        None) and its store key; 404 when it names none the principal owns (DESIGN §3)."""
        episode = self._find(episode_id, principal)
        if episode is None:
            return None, await self.stored.key(principal, episode_id)
        if not principal.is_admin:
            principal.require_episodes(episode.task.sealed, episode.task.split)
        return episode, episode.id

    def _find(self, episode_id: str, principal: Principal) -> Episode | None:
        """The live or recently ended episode `episode_id` names for `principal`; None for
        an unknown id and for another token's episode alike."""
        for key in candidate_keys(principal.token_id, episode_id):
            episode = self._live.get(key) or self._ended.get(key)
            if episode is not None and (episode.owner == principal.token_id or principal.is_admin):
                return episode
        return None

    async def reap(self) -> int:
        """Expire idle episodes; returns how many."""
        await self.checkpoints.sweep()  # the checkpoints of episodes ended since
        deadline = time.monotonic() - self.settings.idle_ttl_s
        idle = [e for e in self._live.values() if e.last_active < deadline and not e.lock.locked()]
        idle = [e for e in idle if e.harness is None or not e.harness.running]
        for episode in idle:
            await self._end(
                episode, EpisodeStatus.EXPIRED, Failure.of(FailureKind.EXPIRED, "idle TTL")
            )
        return len(idle)


class HarnessHandle:
    """A harness run's handle on its episode (server/harness/runner.py `EpisodeHandle`):
    the runner records and finishes through it, and never sees the host."""

    def __init__(self, host: LocalHost, episode: Episode) -> None:
        self._host, self._episode = host, episode

    @property
    def key(self) -> str:
        return self._episode.id

    @property
    def limits(self) -> Limits:
        return self._episode.limits

    @property
    def started(self) -> float:
        return self._episode.started

    @property
    def sandbox(self) -> Sandbox:
        box = self._episode.ctx.sandboxes.episode
        assert box is not None  # a harness episode has one (checked by `open`)
        return box

    @property
    def active(self) -> bool:
        return self._episode.state.status is EpisodeStatus.ACTIVE

    def record(self, action: Action, reply: StepResponse, duration_s: float) -> None:
        self._episode.last_active = time.monotonic()
        self._host.record(self._episode, action, reply, duration_s)

    async def finish(self, ending: HarnessEnding) -> None:
        await self._host.harness_ended(self._episode, ending)

    async def keep_start(self) -> None:
        await self._host.checkpoints.keep_start(self._episode)
