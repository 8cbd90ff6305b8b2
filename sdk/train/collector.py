"""The async rollout collector: N episodes at once, groups of G, never a broken trajectory.

Per group (one task, one seed, G samples) it starts G + `oversample` episodes; the group
is complete as soon as G of them finished cleanly, and the stragglers are cancelled (their
episodes closed), so a group never waits on its slowest member. An episode that breaks —
void (infrastructure fault), lost (404/409: expired or gone), a turn or episode deadline,
a server that keeps answering 429/503 or cannot be reached — is counted by reason and
replaced (refill) while the group's refill budget lasts; otherwise the group is dropped
and counted. Only episodes that ended by the environment's own verdict are trained on.
An infrastructure failure is masked out of group statistics, never scored 0: resampled, or
its group dropped (`on_infrastructure_failure`, sdk/train/masking.py), counted per step.

A semaphore holds live episodes to `concurrency`; over HTTP the connection pool is at
least that large. With `batch_routes` the resets and steps that concurrent episodes issue
in the same event-loop turn go out as one `POST /v1/batch/reset` / `/v1/batch/step`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import random
import time
import uuid
from collections import Counter
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Generic, NoReturn, TypeVar

from palaestra.sdk.client import AsyncBatchClient, AsyncClient
from palaestra.sdk.errors import (
    ConflictError,
    InvalidActionError,
    NotFoundError,
    PalaestraError,
    error_from_response,
)
from palaestra.sdk.groups import GroupScorer
from palaestra.sdk.hack_monitor import MONITOR, HackFlag, HackMonitor, HackTally
from palaestra.sdk.models import (
    Action,
    BatchItemError,
    BatchResetResult,
    BatchStepItem,
    BatchStepResult,
    ResetRequest,
    ResetResponse,
    StepResponse,
)
from palaestra.sdk.train.backends import GenerationBackend
from palaestra.sdk.train.formats import EpisodeFormat, UnparseableAction
from palaestra.sdk.train.group_rewards import apply_group_rewards, group_client
from palaestra.sdk.train.masking import (
    INFRASTRUCTURE_REASONS,
    POLICIES,
    FailureCounts,
    InfrastructurePolicy,
    failure_kind,
)
from palaestra.sdk.train.prefilter import Decision, PreFilter, PreFilterGate, PreFilterReport
from palaestra.sdk.train.types import Group, SamplingParams, StopReason, Trajectory

log = logging.getLogger("palaestra.train")

# Statuses that say the collector's requests are wrong (token, scope, options): raised to
# the caller at once, since every refill would be refused the same way.
REFUSED = frozenset({401, 403, 422})
X = TypeVar("X")
Y = TypeVar("Y")


@dataclass
class CollectorConfig:
    concurrency: int = 64
    group_size: int = 8
    oversample: int = 0
    max_refills: int | None = None  # per group; default: group_size
    max_turns: int = 8
    max_context_tokens: int = 4096
    turn_timeout_s: float = 120.0
    episode_timeout_s: float = 900.0
    retries: int = 6  # per call, for 429 / 503 / transport errors
    backoff_s: float = 0.05
    max_backoff_s: float = 5.0
    batch_routes: bool = True
    # A batch step answers after this long; slower items answer `still_running` and are
    # resent (same request_id), so one slow environment never holds up a whole batch.
    batch_wait_s: float = 0.05
    reset_options: dict[str, Any] = field(default_factory=dict)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    # Rewards from a group judge (POST /v1/groups/verify) instead of each episode's own:
    # "tournament" or "ranking" (sdk/train/group_rewards.py).
    group_scorer: GroupScorer | None = None
    # A cheap scorer of each final answer before the verifier (sdk/train/prefilter.py):
    # below `drop_below` the episode is closed unverified, reward 0, but for an `audit_rate`
    # share, verified to measure agreement (drop ⇔ full reward < `pass_reward`).
    prefilter: PreFilter | None = None
    drop_below: float = 0.0
    audit_rate: float = 0.0
    pass_reward: float = 0.5
    # The reward-hack monitor run over every kept episode's actions (sdk/hack_monitor.py);
    # None: no monitoring. Flags are counted, never acted on.
    hack_monitor: HackMonitor | None = MONITOR
    # What an infrastructure failure of a member does to its group (never a 0 in it):
    # "resample" starts another member (within max_refills); "drop_group" drops the group.
    on_infrastructure_failure: InfrastructurePolicy = "resample"

    def __post_init__(self) -> None:
        if self.on_infrastructure_failure not in POLICIES:
            raise ValueError(
                "on_infrastructure_failure is 'drop_group' or 'resample', not "
                f"{self.on_infrastructure_failure!r}"
            )


class EpisodeBroken(Exception):
    """An episode that must not be trained on; `reason` is the counter it was booked under,
    `kind` the server's failure kind where it said one (sdk/failures.py)."""

    def __init__(self, reason: str, detail: str = "", kind: str | None = None) -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.kind = kind

    @property
    def infrastructure(self) -> bool:
        return self.reason.startswith(INFRASTRUCTURE_REASONS)


def _seed(*parts: object) -> int:
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


class Coalescer(Generic[X, Y]):
    """Items submitted in the same event-loop turn go out in one call (at most `max_items`);
    while `max_in_flight` calls are out, new items wait and form the next call."""

    def __init__(
        self,
        send: Callable[[list[X]], Awaitable[list[Y]]],
        max_items: int = 1024,
        max_in_flight: int = 16,
    ) -> None:
        self.send = send
        self.max_items = max_items
        self.max_in_flight = max_in_flight
        self._pending: list[tuple[X, asyncio.Future[Y]]] = []
        self._scheduled = False
        self._in_flight = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self.calls = 0
        self.items = 0

    async def submit(self, item: X) -> Y:
        future: asyncio.Future[Y] = asyncio.get_running_loop().create_future()
        self._pending.append((item, future))
        self._kick()
        return await future

    def _kick(self) -> None:
        if not self._scheduled and self._pending and self._in_flight < self.max_in_flight:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        batch = [(i, f) for i, f in self._pending[: self.max_items] if not f.done()]
        del self._pending[: self.max_items]
        if not batch:
            self._kick()
            return
        self._in_flight += 1
        task = asyncio.get_running_loop().create_task(self._send(batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        self._kick()

    async def _send(self, batch: list[tuple[X, asyncio.Future[Y]]]) -> None:
        try:
            results = await self.send([item for item, _ in batch])
        except BaseException as exc:
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
        else:
            self.calls += 1
            self.items += len(batch)
            for (_, future), result in zip(batch, results, strict=True):
                if not future.done():
                    future.set_result(result)
        finally:
            self._in_flight -= 1
            self._kick()


def _raise_item(error: BatchItemError) -> NoReturn:
    body = {"error": {"code": error.code, "message": error.message, "retryable": error.retryable}}
    after = None if error.retry_after is None else f"{error.retry_after:g}"
    raise error_from_response(error.status, body, after)


class GroupCollector:
    """The group machinery every collector shares: groups of G episodes of one task and
    seed, over-sampling, refill, deadlines, retries, batch routes, background closes. A
    subclass plays one episode (`_play`) and returns its trajectories (one for a collector
    that owns the loop; one or more for a harness episode, sdk/train/harness.py)."""

    def __init__(
        self,
        client: AsyncClient,
        tasks: Sequence[str],
        config: CollectorConfig | None = None,
        *,
        seed: int = 0,
    ) -> None:
        if not tasks:
            raise ValueError("no tasks to collect on")
        self.client = client
        self.tasks = list(tasks)
        self.config = config or CollectorConfig()
        self.seed = seed
        self.stats: Counter[str] = Counter()
        self.failures = FailureCounts(self.stats)  # infrastructure masked, agents' 0s
        self.hacks = HackTally()  # flagged episodes per domain, since the collector started
        self._rng = random.Random(seed)
        self._next_group = 0
        self._sem: asyncio.Semaphore | None = None
        self._closing: set[asyncio.Task[None]] = set()
        self._steps: Coalescer[BatchStepItem, BatchStepResult] | None = None
        self._resets: Coalescer[ResetRequest, BatchResetResult] | None = None
        self._resends: Coalescer[BatchStepItem, BatchStepResult] | None = None
        scorer = self.config.group_scorer
        self._judge = group_client(client, scorer) if scorer is not None else None
        if self.config.batch_routes:
            if not isinstance(client, AsyncBatchClient):
                raise ValueError("batch_routes needs a client with batch_reset/batch_step")
            send = functools.partial(client.batch_step, wait_s=self.config.batch_wait_s)
            self._steps = Coalescer(send)
            # Resent (still running) steps go in calls of their own: a call of them waits
            # until one finishes, and fresh steps must never queue behind it.
            self._resends = Coalescer(send)
            self._resets = Coalescer(client.batch_reset)

    @staticmethod
    def http_client(
        url: str, config: CollectorConfig, *, token: str | None, timeout_s: float
    ) -> AsyncClient:
        """An HTTP client for a collector: a pool of at least `concurrency` connections,
        and no retries inside the client (the collector retries and counts)."""
        from palaestra.sdk.http import AsyncHTTPClient, RetryPolicy

        return AsyncHTTPClient(
            url,
            token=token,
            timeout=timeout_s,
            retry=RetryPolicy(attempts=1),
            max_connections=max(config.concurrency, 16),
        )

    def reset_options(self) -> dict[str, Any]:
        """The `options` of every reset."""
        return self.config.reset_options

    async def _play(self, task: str, seed: int, gid: int, sid: int) -> list[Trajectory]:
        raise NotImplementedError

    def monitor(self, domain: str, actions: Sequence[Action]) -> list[HackFlag]:
        """The hack monitor's flags on one kept episode's actions, counted in `stats`
        (`hack_flagged`, `hack_rule:<rule>`) and in `hacks` (per domain)."""
        monitor = self.config.hack_monitor
        flags = monitor.scan(actions) if monitor is not None else []
        self.hacks.add(domain, flags)
        self.stats["hack_flagged"] += bool(flags)
        self.stats.update(f"hack_rule:{rule}" for rule in {f.rule for f in flags})
        return flags

    def take_step_counts(self) -> dict[str, int]:
        """Failures since the last call, one training step's (`FailureCounts.take`)."""
        return self.failures.take()

    # -- groups -----------------------------------------------------------------------------
    def next_group(self) -> tuple[int, str, int]:
        """(group id, task, seed) of the next group; drawn from the collector's own RNG."""
        gid = self._next_group
        self._next_group += 1
        return gid, self._rng.choice(self.tasks), self._rng.getrandbits(31)

    async def collect(self, n_groups: int) -> list[Group]:
        """`n_groups` groups, run concurrently (the semaphore bounds live episodes)."""
        specs = [self.next_group() for _ in range(n_groups)]
        results = await asyncio.gather(*(self.group(*spec) for spec in specs))
        return [g for g in results if g is not None]

    async def stream(self, groups_in_flight: int) -> AsyncGenerator[Group, None]:
        """Groups as they complete, keeping `groups_in_flight` running (async training)."""
        running: set[asyncio.Task[Group | None]] = set()
        try:
            while True:
                while len(running) < groups_in_flight:
                    running.add(asyncio.create_task(self.group(*self.next_group())))
                done, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    group = task.result()
                    if group is not None:
                        yield group
        finally:
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)

    async def group(self, gid: int, task: str, seed: int) -> Group | None:
        """G clean trajectories of (task, seed), or None (dropped, counted) if it cannot."""
        size = self.config.group_size
        refills = size if self.config.max_refills is None else self.config.max_refills
        budget = size + self.config.oversample + refills
        done: list[list[Trajectory]] = []
        running: set[asyncio.Task[list[Trajectory]]] = set()
        started = 0

        def launch() -> None:
            nonlocal started
            coro = self._episode(task, seed, gid, started)
            running.add(asyncio.create_task(coro, name=f"episode-{gid}-{started}"))
            started += 1

        for _ in range(size + self.config.oversample):
            launch()
        try:
            while len(done) < size:
                if not running:
                    self.stats["groups_dropped"] += 1
                    return None
                finished, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                errors = [t.exception() for t in finished]  # each one retrieved
                for error in errors:  # the server refuses the collector's own requests
                    if isinstance(error, PalaestraError) and error.status in REFUSED:
                        raise error
                drop = False  # drop_group: a member failed for an infrastructure reason
                for episode in sorted(finished, key=lambda t: t.get_name()):
                    error = episode.exception()
                    if error is None:
                        done.append(episode.result())
                        continue
                    if not isinstance(error, EpisodeBroken):
                        self.stats["broken:unexpected"] += 1
                        log.error("an episode failed unexpectedly (a bug?)", exc_info=error)
                    elif error.infrastructure:
                        self.failures.infrastructure(error.kind or error.reason)
                        drop |= self.config.on_infrastructure_failure == "drop_group"
                    if not drop and len(done) + len(running) < size and started < budget:
                        self.stats["refills"] += 1
                        launch()
                if drop:
                    self.failures.group_dropped(len(done))
                    self.stats["groups_dropped"] += 1
                    return None
        finally:
            self.stats["stragglers_cancelled"] += len(running)
            for episode in running:
                episode.cancel()
            await asyncio.gather(*running, return_exceptions=True)
        trajectories = [t for episode in done[:size] for t in episode]
        group = Group(group_id=gid, task=task, seed=seed, trajectories=trajectories)
        scorer = self.config.group_scorer
        judge = self._judge
        if judge and scorer and not await apply_group_rewards(judge, scorer, group, self.stats):
            return None
        self.stats["groups"] += 1
        self.stats["surplus"] += len(done) - size
        return group

    # -- one episode ------------------------------------------------------------------------
    async def _episode(self, task: str, seed: int, gid: int, sid: int) -> list[Trajectory]:
        if self._sem is None:
            self._sem = asyncio.Semaphore(self.config.concurrency)
        async with self._sem:
            self.stats["episodes_started"] += 1
            try:
                return await asyncio.wait_for(
                    self._play(task, seed, gid, sid), self.config.episode_timeout_s
                )
            except TimeoutError:
                self.stats["broken:episode_timeout"] += 1
                raise EpisodeBroken("episode_timeout") from None
            except EpisodeBroken as exc:
                self.stats[f"broken:{exc.reason}"] += 1
                raise

    # -- calls to the server ------------------------------------------------------------------
    async def _retrying(self, call: Callable[[], Awaitable[Y]]) -> Y:
        """Retry what is retryable (429, 503, transport) with backoff, counting each."""
        cfg = self.config
        for attempt in range(cfg.retries + 1):
            try:
                return await call()
            except PalaestraError as exc:
                if not exc.retryable or attempt >= cfg.retries:
                    raise
                kind = "capacity" if exc.status == 429 else exc.code
                self.stats[f"backoff:{kind}"] += 1
                delay = min(cfg.max_backoff_s, cfg.backoff_s * 2**attempt)
                if exc.retry_after is not None:
                    delay = min(cfg.max_backoff_s, max(delay, exc.retry_after))
                await asyncio.sleep(delay * (0.5 + random.random() / 2))
        raise AssertionError("unreachable")

    async def _reset(self, task: str, seed: int) -> ResetResponse:
        while True:
            request = ResetRequest(
                task=task,
                seed=seed,
                episode_id=uuid.uuid4().hex,
                options=self.reset_options(),
            )
            try:
                return await self._retrying(functools.partial(self._reset_once, request))
            except ConflictError as exc:
                if exc.code != "episode_exists":
                    raise
                # A retried reset whose first try did start the episode: close it, go again.
                self.stats["reset_replayed"] += 1
                self._close_later(request.episode_id or "")

    async def _reset_once(self, request: ResetRequest) -> ResetResponse:
        if self._resets is None:
            return await self.client.reset(
                request.task,
                seed=request.seed,
                episode_id=request.episode_id,
                options=request.options,
            )
        out = await self._resets.submit(request)
        if out.error is not None:
            _raise_item(out.error)
        assert out.result is not None
        return out.result

    async def _step(self, eid: str, action: Action) -> StepResponse:
        item = BatchStepItem(episode_id=eid, action=action, request_id=uuid.uuid4().hex)
        return await self._retrying(functools.partial(self._step_once, item))

    async def _step_once(self, item: BatchStepItem) -> StepResponse:
        """One try; a retry sends the same `request_id`, so it never steps twice."""
        if self._steps is None:
            return await self.client.step(item.episode_id, item.action, request_id=item.request_id)
        out = await self._steps.submit(item)
        while out.error is not None and out.error.code == "still_running":
            self.stats["steps_resent"] += 1
            assert self._resends is not None
            out = await self._resends.submit(item)  # joins the step running on the server
        if out.error is not None:
            _raise_item(out.error)
        assert out.result is not None
        return out.result

    def _close_later(self, eid: str) -> None:
        """Close an abandoned episode in the background: a close waits for a step still
        running on the server (a hung environment), and the group must not."""
        task = asyncio.get_running_loop().create_task(self._close_quietly(eid))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def _close_quietly(self, eid: str) -> None:
        with contextlib.suppress(Exception):
            await self.client.close(eid)

    async def drain(self) -> None:
        """Wait until every abandoned episode is closed."""
        while self._closing:
            await asyncio.gather(*list(self._closing), return_exceptions=True)

    async def aclose(self) -> None:
        await self.drain()
        closer = getattr(self.client, "aclose", None)
        if closer is not None:
            await closer()


class RolloutCollector(GroupCollector):
    """Runs episodes of `tasks` (task refs) with `backend` through `client`, in groups: the
    collector owns the loop (generate a turn, step, until the episode ends)."""

    def __init__(
        self,
        client: AsyncClient,
        backend: GenerationBackend,
        fmt: EpisodeFormat,
        tasks: Sequence[str],
        config: CollectorConfig | None = None,
        *,
        seed: int = 0,
    ) -> None:
        if not backend.token_exact:
            raise ValueError(
                "this backend re-tokenizes text (token_exact=False): fine for evaluation, "
                "but training needs the sampled token ids; use HF, the vLLM engine or a "
                "vLLM server with token ids"
            )
        super().__init__(client, tasks, config, seed=seed)
        self.backend = backend
        self.fmt = fmt
        cfg = self.config
        self.prefilter = (
            None
            if cfg.prefilter is None
            else PreFilterGate(
                cfg.prefilter,
                drop_below=cfg.drop_below,
                audit_rate=cfg.audit_rate,
                pass_reward=cfg.pass_reward,
                seed=seed,
            )
        )

    @property
    def prefilter_report(self) -> PreFilterReport | None:
        """The pre-filter's drop share and agreement with the verifier (None: no filter)."""
        return None if self.prefilter is None else self.prefilter.report

    @classmethod
    def over_http(
        cls,
        url: str,
        backend: GenerationBackend,
        fmt: EpisodeFormat,
        tasks: Sequence[str],
        config: CollectorConfig | None = None,
        *,
        token: str | None = None,
        seed: int = 0,
        timeout_s: float = 300.0,
    ) -> RolloutCollector:
        """A collector with its own HTTP client (`GroupCollector.http_client`)."""
        config = config or CollectorConfig()
        client = cls.http_client(url, config, token=token, timeout_s=timeout_s)
        return cls(client, backend, fmt, tasks, config, seed=seed)

    async def _play(self, task: str, seed: int, gid: int, sid: int) -> list[Trajectory]:
        cfg = self.config
        reset = await self._reset(task, seed)
        eid = reset.episode_id
        ended = False
        try:
            traj = Trajectory(
                prompt_ids=self.fmt.prompt_ids(reset),
                task=task,
                seed=seed,
                group_id=gid,
                sample_id=sid,
                episode_id=eid,
                domain=str(reset.info.get("domain", "")),
            )
            actions: list[Action] = []
            stop: StopReason | None = None
            decision: Decision | None = None
            for turn in range(cfg.max_turns):
                room = cfg.max_context_tokens - len(traj.prompt_ids) - len(traj.completion_ids)
                if room <= 0:
                    stop = "max_tokens"
                    break
                params = replace(
                    cfg.sampling,
                    max_tokens=min(cfg.sampling.max_tokens, room),
                    stop_token_ids=cfg.sampling.stop_token_ids or self.fmt.stop_token_ids,
                    seed=_seed(self.seed, task, seed, gid, sid, turn),
                )
                started = time.perf_counter()
                try:
                    gen = await asyncio.wait_for(
                        self.backend.generate(traj.prompt_ids + traj.completion_ids, params),
                        cfg.turn_timeout_s,
                    )
                except TimeoutError:
                    raise EpisodeBroken("turn_timeout", "generation") from None
                finally:
                    traj.generation_s += time.perf_counter() - started
                traj.append_sampled(gen.ids, gen.logprobs)
                traj.weight_versions.append(gen.weight_version)
                traj.turns += 1
                try:
                    action = self.fmt.parse_action(gen.ids)
                except UnparseableAction as exc:
                    self.stats["unparseable_actions"] += 1
                    traj.append_environment(self.fmt.error_ids(str(exc)))
                    continue
                actions.append(action)
                if self.prefilter is not None and action.tool == "submit":
                    key = (task, seed, gid, sid)
                    decision = await self.prefilter.decide(reset.observation.text, action, key)
                    traj.prefiltered, traj.prefilter_score = decision.drop, decision.score
                    if decision.skip:  # closed unverified (the finally), trained as a 0
                        traj.reward = 0.0
                        break
                started = time.perf_counter()
                try:
                    reply = await asyncio.wait_for(self._step(eid, action), cfg.turn_timeout_s)
                except TimeoutError:
                    raise EpisodeBroken("turn_timeout", "environment") from None
                except InvalidActionError as exc:
                    self.stats["invalid_actions"] += 1
                    traj.append_environment(self.fmt.error_ids(exc.message))
                    continue
                finally:
                    traj.environment_s += time.perf_counter() - started
                if reply.info.get("status") == "void":
                    ended = True
                    why = str(reply.info.get("void_reason", ""))
                    raise EpisodeBroken("void", why, failure_kind(reply.info))
                if reply.terminated or reply.truncated:
                    ended = True
                    self.failures.agent(failure_kind(reply.info))
                    traj.reward = reply.reward
                    if decision is not None and self.prefilter is not None:
                        traj.verifier_reward = reply.reward if decision.drop else None
                        traj.reward = self.prefilter.settle(decision, reply.reward)
                    traj.stop_reason = "terminated" if reply.terminated else "truncated"
                    break
                traj.append_environment(self.fmt.observation_ids(reply))
            if decision is not None and decision.skip:
                pass  # the pre-filter dropped it: no verdict
            elif not ended:
                # Out of turns or context: the verdict on the state as it is.
                verdict = await self._retrying(lambda: self.client.verify(eid))
                ended = True
                kind = None if verdict.failure_kind is None else verdict.failure_kind.value
                if verdict.status == "void":
                    raise EpisodeBroken("void", verdict.feedback, kind)
                self.failures.agent(kind)
                traj.reward = verdict.reward
                traj.stop_reason = stop or "max_turns"
            traj.check()
            traj.hack_flags = self.monitor(traj.domain, actions)
            self.stats["episodes_ok"] += 1
            return [traj]
        except (NotFoundError, ConflictError) as exc:
            raise EpisodeBroken("lost", exc.message) from None
        except PalaestraError as exc:
            raise EpisodeBroken(f"server_{exc.code}", exc.message) from None
        finally:
            if not ended:
                self._close_later(eid)
