"""The episode manager: live episodes, their sandboxes, limits, and what gets stored.

Every route of the wire API and the in-process clients end here. Rules it keeps:
- a step with a `request_id` seen before returns the stored result; it never steps twice;
- a malformed action is refused (422) and the episode goes on;
- an infrastructure fault (sandbox died, verifier or family crashed) ends the episode
  `void`, never with reward 0;
- the verdict's reward arrives with the step that ends the episode;
- idle episodes expire after a TTL and their sandboxes are freed at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from palaestra.envs.base import EpisodeContext, StepOutcome
from palaestra.sandbox import AgentFault, Backend, SandboxError
from palaestra.sandbox.forkserver import PythonForkServer
from palaestra.sdk.errors import (
    CapacityError,
    ConflictError,
    InvalidActionError,
    PermissionDeniedError,
    UnavailableError,
)
from palaestra.sdk.models import (
    EpisodeState,
    EpisodeStatus,
    Observation,
    ResetRequest,
    ResetResponse,
    StepRequest,
    StepResponse,
    Verdict,
    step_record_json,
)
from palaestra.server.auth import ADMIN, ADMIN_PRINCIPAL, Principal
from palaestra.server.catalog import Catalog
from palaestra.server.ceilings import check_task, client_limits
from palaestra.server.config import Settings
from palaestra.server.episode import (
    Episode,
    assess,
    id_taken,
    log_crash,
    sandbox_fault,
    task_info,
    unknown_episode,
    void_verdict,
)
from palaestra.server.families import FamilyRegistry, unjudged_families
from palaestra.server.groups import GroupVerifier
from palaestra.server.harness.runner import Ending, HarnessRunner
from palaestra.server.metrics import Metrics
from palaestra.server.packs.catalog import PackCatalog
from palaestra.server.packs.registry import PackRegistry
from palaestra.server.sampler import Sampler
from palaestra.server.sandboxes import SandboxOwner
from palaestra.server.store import Store
from palaestra.server.tenancy import Tenancy, candidate_keys, episode_key
from palaestra.verifiers.judge_protocol import Judges, NoJudges

if TYPE_CHECKING:
    from palaestra.server.harness.proxy import SessionProxy

log = logging.getLogger("palaestra.episodes")

ENDED_CACHE = 4096


class EpisodeManager:
    catalog_class: type[Catalog] = Catalog  # a cluster front's also exports what is published

    def __init__(
        self,
        settings: Settings,
        *,
        families: FamilyRegistry,
        packs: PackCatalog,
        backend: Backend | None,
        store: Store,
        metrics: Metrics | None = None,
        fork_server: PythonForkServer | None = None,
        registry: PackRegistry | None = None,
        proxy: SessionProxy | None = None,
        judges: Judges | None = None,
    ) -> None:
        self.settings = settings
        self.judges: Judges = judges or NoJudges()  # shared by every episode's verifier
        self.registry = registry
        self.fork_server = fork_server
        self.families = families
        self.packs = packs
        self.backend = backend
        self.store = store
        self.metrics = metrics or Metrics()
        self.llm_proxy = proxy  # harness mode: the model sessions (server/runtime.py)
        self.harness = HarnessRunner(settings, store, proxy)  # harness episodes
        self.groups = GroupVerifier(self)  # POST /v1/groups/verify (server/groups.py)
        self._live: dict[str, Episode] = {}
        self._ended: OrderedDict[str, Episode] = OrderedDict()
        self._pending = 0
        self._reserved: set[str] = set()  # keys of episodes being started
        self.tenancy = Tenancy(settings)
        self._reaper: asyncio.Task[None] | None = None
        self._detached: set[asyncio.Future[Any]] = set()
        self.metrics.bind_live(self._live_by_status, lambda: self.sandboxes.live_count)
        self.sampler = Sampler(settings, packs, unjudged=unjudged_families(settings, families))
        self.metrics.bind_sampler(self.sampler.quarantined_count)
        self.sandboxes = SandboxOwner(settings, backend, fork_server)
        self.catalog = self.catalog_class(
            settings,
            families=families,
            packs=packs,
            sampler=self.sampler,
            store=store,
            registry=registry,
            sandboxes=self.sandboxes,
        )

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        voided = await self.store.mark_unfinished(
            EpisodeStatus.VOID.value, "server restarted", time.time()
        )
        if voided:
            log.warning("marked %d episodes left active by a previous server as void", voided)
        history = await self.store.sampler_history(self.settings.sampler_history)
        self.sampler.replay(history)
        self.sampler.refresh()
        starts = await self.store.starts_since(time.time() - 3600.0)
        self.tenancy.restore_starts(starts)
        self._reaper = asyncio.create_task(self._reap_forever(), name="palaestra-reaper")
        if self.packs.warmer is not None:  # packs not cached: generated in the background
            self.packs.warmer.start()

    async def shutdown(self) -> None:
        if self.packs.warmer is not None:
            await self.packs.warmer.aclose()
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        for work in list(self._detached):
            work.cancel()
        await asyncio.gather(*self._detached, return_exceptions=True)
        await self.harness.aclose()
        for episode in list(self._live.values()):
            await self._end(episode, EpisodeStatus.VOID, reason="server shut down")
        await self.sandboxes.aclose()
        aclose = getattr(self.judges, "aclose", None)  # ServerJudges' pooled client
        if aclose is not None:
            await aclose()
        await self.store.aclose()

    def detach(self, work: asyncio.Future[Any], owner: str | None = None) -> None:
        """Let `work` run on after its caller stopped waiting (a batch step answered
        `still_running`): referenced until it is done, cancelled at shutdown, and counted
        against `owner`'s pending quota while it runs."""
        self._detached.add(work)
        work.add_done_callback(self._detached.discard)
        if owner is not None:
            self.tenancy.pending(owner, +1)
            work.add_done_callback(lambda _: self.tenancy.pending(owner, -1))

    @property
    def ready(self) -> bool:
        return self._reaper is not None and not self._reaper.done()

    @property
    def live_count(self) -> int:
        """Live episodes, and those being started."""
        return len(self._live) + self._pending

    def _live_by_status(self) -> dict[str, int]:
        return {EpisodeStatus.ACTIVE.value: len(self._live)}

    async def render_metrics(self) -> bytes:
        """This server's Prometheus exposition (a cluster front adds its workers')."""
        return self.metrics.render()

    # -- episodes -------------------------------------------------------------------------
    async def reset(
        self,
        request: ResetRequest,
        principal: Principal = ADMIN_PRINCIPAL,
        *,
        new_id: str | None = None,
    ) -> ResetResponse:
        """Start an episode; `new_id` is the server-made id to give it (a cluster front
        chooses it, so the ledger knows the episode before a worker starts it)."""
        if len(self._live) + self._pending >= self.settings.max_episodes:
            raise CapacityError(
                f"the server holds its limit of {self.settings.max_episodes} live episodes; "
                "close finished episodes or retry later",
                retry_after=1.0,
            )
        probability: float | None = None
        if request.task:
            task = self.packs.resolve(request.task)
        else:
            task, probability = self.sampler.sample(
                request.seed, pack=request.pack, split=request.split, domain=request.domain
            )
        principal.require_episodes(task.sealed, task.split)
        owner = principal.token_id
        episode_id = episode_key(owner, request.episode_id, new_id or uuid.uuid4().hex)
        if episode_id in self._live or episode_id in self._ended or episode_id in self._reserved:
            raise id_taken(request.episode_id or episode_id)
        wants_oracle = bool(request.options.get("oracle"))
        if wants_oracle and not self.settings.allow_oracle:
            raise PermissionDeniedError("this server does not allow oracle-driven episodes")
        if wants_oracle and task.sealed and not principal.is_admin:
            raise PermissionDeniedError(
                f"the oracle on sealed split {task.split!r} needs a token with the 'admin' scope",
                code="missing_scope",
            )
        family = self.families.get(task.family)
        check_task(task, self.settings)  # 422 over an operator ceiling (server/ceilings.py)
        limits = client_limits(request.options, self.settings)
        limits = family.episode_limits(task, request.options, limits)  # a family's own caps
        plan = await self.harness.plan(request.options, principal, family, task)
        admitted = self.tenancy.admit(principal)  # 429 over the token's quota
        self._reserved.add(episode_id)
        self._pending += 1
        try:
            # also taken when stored by an earlier server
            if request.episode_id and await self.store.owners((episode_id,)):
                raise id_taken(request.episode_id)
            sandboxes = self.sandboxes.for_episode(family, task)
            ctx = EpisodeContext(
                episode_id=episode_id,
                task=task,
                seed=request.seed,
                options=request.options,
                sandboxes=sandboxes,
                judges=self.judges,
            )
            spec, run = family.sandbox_spec(task), None
            if plan is not None:  # the sandbox reaches the episode's model session alone
                run, spec = self.harness.prepare(plan, spec, episode_id, owner)
            try:
                await self.sandboxes.start(sandboxes, spec)
                observation = await family.reset(ctx)
                if run is not None:
                    await self.harness.stage(run, sandboxes, observation)
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
        except BaseException:
            self.tenancy.refund(owner, admitted)
            raise
        finally:
            self._pending -= 1
            self._reserved.discard(episode_id)
        now = time.time()
        state = EpisodeState(
            episode_id=episode_id,
            task=task.ref,
            family=task.family,
            domain=task.domain,
            split=task.split,
            status=EpisodeStatus.ACTIVE,
            step_count=0,
            created_at=now,
            updated_at=now,
        )
        mono = time.monotonic()
        episode = Episode(
            step_timer=self.metrics.step_seconds.labels(task.family),
            task=task,
            family=family,
            ctx=ctx,
            limits=limits,
            state=state,
            started=mono,
            last_active=mono,
            oracle=family.oracle(task) if wants_oracle else None,
            owner=owner,
            harness=run,
        )
        self._live[episode_id] = episode
        self.store.create_episode(state, task.digest, task.sealed, owner=owner)
        await self.store.commit()  # an episode a client was told of survives a crash
        if run is not None:
            self.detach(self.harness.launch(run, episode, self._harness_ended))
        self.metrics.episodes_started.labels(family=task.family).inc()
        log.info("episode started", extra={"episode_id": episode_id, "task_digest": task.digest})
        info = task_info(task)
        if run is not None:
            info["harness"] = run.snapshot().model_dump(mode="json")
        if probability is not None:
            info["sampled"] = {"probability": probability}
        elif (note := self.sampler.quarantine_note(task.ref)) is not None:
            info["quarantined"] = f"run on request; the sampler holds it back: {note}"
        if self.packs.is_yanked(task.pack, task.version):  # an exact pin reached it
            info["yanked"] = f"{task.pack}@{task.version} is yanked by its publisher"
        return ResetResponse(
            episode_id=request.episode_id or episode_id,
            observation=observation,
            tools=family.tool_specs(),
            limits=limits,
            info=info,
        )

    async def step(
        self, episode_id: str, request: StepRequest, principal: Principal = ADMIN_PRINCIPAL
    ) -> StepResponse:
        episode = self._find(episode_id, principal)
        if episode is None:
            key = await self._stored_key(principal, episode_id)
            return await self._replay_or_refuse(key, episode_id, request.request_id)
        if ADMIN not in principal.scopes:
            principal.require_episodes(episode.task.sealed, episode.task.split)
        async with episode.lock:
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
            self.harness.refuse_step(episode, episode_id)  # 409: the harness owns the loop
            self.tenancy.check_cpu(principal)  # 429 while over its CPU-seconds per hour
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
                self.tenancy.charge(episode.owner, spent)
            episode.count_step(reply, outcome)
            if reply.terminated or reply.truncated:
                reply.info["metrics"] = episode.settled_state().metrics.model_dump(mode="json")
            duration = time.perf_counter() - started
            episode.step_timer.observe(duration)
            index, now = episode.state.step_count, time.time()
            record = step_record_json(
                index=index,
                request_id=request.request_id,
                action=recorded,
                observation=reply.observation,
                reward=reply.reward,
                terminated=reply.terminated,
                truncated=reply.truncated,
                info=reply.info,
                duration_s=duration,
                at=now,
            )
            # The trajectory lives in the store only: it can be large, and a live copy of
            # every step would be walked by every garbage collection.
            self.store.add_step(episode.id, index, request.request_id, record)
            episode.state.step_count = index + 1
            episode.state.updated_at = now
            if request.request_id:
                episode.remember(request.request_id, reply)
            if reply.terminated or reply.truncated:
                self.store.update_episode(episode.settled_state())
                # The client learns that the episode ended only once it is on disk.
                await self.store.commit()
            return reply

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
            return await self._void(episode, f"sandbox failed: {exc}"), None
        except Exception as exc:
            log_crash(episode, f"family {episode.family.name} crashed in step", exc)
            reason = f"the environment crashed ({type(exc).__name__})"
            return await self._void(episode, reason), None
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
        return StepResponse(observation=outcome.observation, info=dict(outcome.info)), outcome

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
        return StepResponse(
            observation=observation,
            reward=verdict.reward,
            terminated=terminated,
            truncated=truncated,
            info=out,
        )

    async def _void(self, episode: Episode, reason: str) -> StepResponse:
        await self._end(episode, EpisodeStatus.VOID, reason=reason)
        verdict = void_verdict(episode.task.digest, reason, 0.0)
        episode.state.verdict = verdict
        self.store.put_verdict(episode.id, verdict)
        return StepResponse(
            observation=Observation(text=f"episode void: {reason}"),
            terminated=True,
            info={
                "status": "void",
                "void_reason": reason,
                "verdict": verdict.model_dump(mode="json"),
            },
        )

    async def _verify(self, episode: Episode) -> Verdict:
        """Verify once; the verdict is cached on the episode and stored."""
        if episode.state.verdict is not None:
            return episode.state.verdict
        started = time.perf_counter()
        verdict, status, reason = await assess(episode)
        self.metrics.verify_seconds.labels(episode.task.family).observe(
            time.perf_counter() - started
        )
        episode.state.timings["verify_s"] = round(time.perf_counter() - started, 6)
        episode.state.verdict = verdict
        self.store.put_verdict(episode.id, verdict)
        await self._end(episode, status, reason=reason)
        return verdict

    async def _end(
        self, episode: Episode, status: EpisodeStatus, reason: str | None = None
    ) -> None:
        if episode.state.status is not EpisodeStatus.ACTIVE:
            return
        now = time.time()
        episode.state.status = status
        episode.state.ended_at = now
        episode.state.updated_at = now
        episode.state.void_reason = reason if status is EpisodeStatus.VOID else None
        episode.state.timings["wall_s"] = round(time.monotonic() - episode.started, 6)
        if self._live.pop(episode.id, None) is not None:
            self.tenancy.ended(episode.owner)
        self._ended[episode.id] = episode
        episode.replies.clear()  # retries of an ended episode's steps come from the store
        if len(self._ended) > ENDED_CACHE:
            self._ended.popitem(last=False)
        self.metrics.episodes_ended.labels(status=status.value).inc()
        verdict = episode.state.verdict
        self.sampler.record(
            episode.task.ref,
            status.value,
            verdict.reward if verdict is not None else 0.0,
            verdict.passed if verdict is not None else False,
            reason=reason,
            at=now,
        )
        self.store.update_episode(episode.settled_state())
        self.tenancy.charge(episode.owner, episode.meter() or 0.0)  # what verify used
        await self.sandboxes.free(episode.ctx.sandboxes)
        log.info(
            "episode ended: %s",
            status.value,
            extra={"episode_id": episode.id, "task_digest": episode.task.digest},
        )

    async def verify(self, episode_id: str, principal: Principal = ADMIN_PRINCIPAL) -> Verdict:
        """Verify now (ending the episode if it is still active), or return the stored verdict."""
        episode, key = await self.owned(principal, episode_id)
        if episode is None:
            stored = await self._load(key, episode_id)
            if stored.verdict is None:
                raise ConflictError(
                    f"episode {episode_id} ended ({stored.status.value}) unverified"
                )
            return stored.verdict
        await self.harness.wait(episode)  # a harness's end verifies its episode
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

    async def state(self, episode_id: str, principal: Principal = ADMIN_PRINCIPAL) -> EpisodeState:
        episode, key = await self.owned(principal, episode_id)
        if episode is None:
            return await self._load(key, episode_id)
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

    async def close(self, episode_id: str, principal: Principal = ADMIN_PRINCIPAL) -> None:
        episode, _ = await self.owned(principal, episode_id)  # 404: not the caller's
        if episode is None:
            return  # stored, so ended: closing twice is fine
        await self.harness.stop(episode.harness)  # a harness is killed; no verdict
        async with episode.lock:
            await self._end(episode, EpisodeStatus.CLOSED)

    async def _harness_ended(self, episode: Episode, ending: Ending) -> None:
        """A harness stopped (server/harness/runner.py): verify, or void on a fault."""
        async with episode.lock:
            if episode.state.status is not EpisodeStatus.ACTIVE or episode.harness is None:
                return
            if ending.void is not None:
                reply = await self._void(episode, ending.void)
            else:
                obs, cut = Observation(text=ending.reason), ending.truncated
                reply = await self._finish(episode, obs, terminated=not cut, truncated=cut)
            self.harness.final_record(episode.harness, episode, reply)
            self.store.update_episode(episode.settled_state())
            await self.store.commit()

    # -- helpers --------------------------------------------------------------------------
    async def owned(self, principal: Principal, episode_id: str) -> tuple[Episode | None, str]:
        """The live (or recently ended) episode `episode_id` names for `principal` (else
        None) and its store key; 404 when it names none the principal owns (DESIGN §3). The
        one ownership check of every route and of groups (server/groups.py)."""
        episode = self._find(episode_id, principal)
        if episode is None:
            return None, await self._stored_key(principal, episode_id)
        if not principal.is_admin:
            principal.require_episodes(episode.task.sealed, episode.task.split)
        return episode, episode.id

    async def _stored_key(self, principal: Principal, episode_id: str) -> str:
        """The store key of the stored episode `episode_id` names for `principal`.

        Another token's episode answers exactly as an unknown id does (404, same message):
        no existence oracle, and no split oracle (the sealed check comes after ownership)."""
        keys = candidate_keys(principal.token_id, episode_id)
        found = await self.store.owners(keys)
        for key in keys:
            row = found.get(key)
            if row is None:
                continue
            if principal.is_admin:
                return key
            if row[0] == principal.token_id:
                principal.require_episodes(row[1], None)
                return key
        raise unknown_episode(episode_id)

    def _find(self, episode_id: str, principal: Principal = ADMIN_PRINCIPAL) -> Episode | None:
        """The live or recently ended episode `episode_id` names for `principal`; None for
        an unknown id and for another token's episode alike."""
        for key in candidate_keys(principal.token_id, episode_id):
            episode = self._live.get(key) or self._ended.get(key)
            if episode is not None and (episode.owner == principal.token_id or principal.is_admin):
                return episode
        return None

    async def _load(self, key: str, episode_id: str) -> EpisodeState:
        """The stored episode under `key`, shown under the id the caller used."""
        state = await self.store.load_episode(key)
        if state is None:
            raise unknown_episode(episode_id)
        state.episode_id = episode_id
        return state

    async def _replay_or_refuse(
        self, key: str, episode_id: str, request_id: str | None
    ) -> StepResponse:
        if request_id:
            stored = await self.store.find_step(key, request_id)
            if stored is not None:
                return stored
        state = await self._load(key, episode_id)
        raise ConflictError(
            f"episode {episode_id} has ended ({state.status.value}); start a new one"
        )

    async def _reap_forever(self) -> None:
        while True:
            await asyncio.sleep(self.settings.reaper_interval_s)
            await self.reap()

    async def reap(self) -> int:
        """Expire idle episodes; returns how many."""
        deadline = time.monotonic() - self.settings.idle_ttl_s
        idle = [e for e in self._live.values() if e.last_active < deadline and not e.lock.locked()]
        idle = [e for e in idle if e.harness is None or not e.harness.running]
        for episode in idle:
            await self._end(episode, EpisodeStatus.EXPIRED, reason="idle TTL")
        self.tenancy.prune()
        return len(idle)
