"""The task sampler behind `POST /v1/episodes` without a task (DESIGN §3); docs/sampler.md.

Three levels, each a weighted choice:

1. a pack (its newest version), by the mixture weight of the pack (default 1);
2. a domain of that pack, by the mixture weight of the domain (default 1);
3. a task of that domain, by its curriculum weight
   `w = floor + (1 - floor) * (4 p (1 - p)) ** alpha`, where `p = (passes + 1) / (n + 2)` is
   the Beta(1, 1) posterior mean over the task's last `window` verified episodes
   (1 for every task when the curriculum is off).

Filters from the reset request (pack, split, domain prefix) apply first; with no `split`
only public splits are drawn from (a sealed split only when asked for by name). A task
whose last `void_window` episodes hold `void_limit` voids is quarantined (weight 0) until
its cool-down ends or an admin releases it; an explicit `task=` reset still runs it.

Cost per draw: two binary searches over cached cumulative weights (packs, then domains of
the pack) and one descent of a Fenwick tree per (pack, split, domain) group, O(log n); a
verdict updates one tree in O(log n). Caches are rebuilt when packs or quarantines change.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import logging
import random
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from palaestra.sdk.errors import NotFoundError
from palaestra.sdk.models import (
    QuarantinedTask,
    SamplerDomainInfo,
    SamplerPackInfo,
    SamplerReport,
    SamplerTaskInfo,
)
from palaestra.sdk.task import Task
from palaestra.server.config import Settings
from palaestra.server.packs.catalog import PackCatalog

log = logging.getLogger("palaestra.sampler")

# Voids the server causes itself say nothing about the task; they never count.
LIFECYCLE_VOIDS = frozenset({"server shut down", "server restarted", "worker_lost"})
PLAN_CACHE = 256
REBUILD_EVERY = 100_000  # tree updates between exact rebuilds (float drift)

RULE = (
    "P(task) = P(pack) * P(domain | pack) * w(task) / sum of w over the domain's eligible tasks; "
    "P(pack) and P(domain | pack) are the mixture weights (default 1) normalized over the "
    "packs and domains left by the request's filters; "
    "w = floor + (1 - floor) * (4 p (1 - p)) ** alpha with p = (passes + 1) / (n + 2) over the "
    "task's last `window` verified episodes (w = 1 with the curriculum off); "
    "quarantined tasks have w = 0"
)


def curriculum_weight(p: float, alpha: float, floor: float) -> float:
    """1 at the frontier (p = 0.5), `floor` at p = 0 or 1."""
    return float(floor + (1.0 - floor) * (4.0 * p * (1.0 - p)) ** alpha)


class _Fenwick:
    """Prefix sums over non-negative weights: update and weighted draw in O(log n)."""

    __slots__ = ("_top", "tree", "updates", "values")

    def __init__(self, values: list[float]) -> None:
        self.values = values
        self._top = 1 << max(len(values).bit_length() - 1, 0) if values else 0
        self._build()

    def _build(self) -> None:
        n = len(self.values)
        tree = [0.0, *self.values]
        for i in range(1, n + 1):
            j = i + (i & -i)
            if j <= n:
                tree[j] += tree[i]
        self.tree = tree
        self.updates = 0

    def set(self, i: int, value: float) -> None:
        delta = value - self.values[i]
        if delta == 0.0:
            return
        self.values[i] = value
        self.updates += 1
        if self.updates >= REBUILD_EVERY:
            self._build()
            return
        n, tree, i = len(self.values), self.tree, i + 1
        while i <= n:
            tree[i] += delta
            i += i & -i

    def total(self) -> float:
        i, s, tree = len(self.values), 0.0, self.tree
        while i > 0:
            s += tree[i]
            i -= i & -i
        return s

    def find(self, target: float) -> int:
        """The index whose cumulative range holds `target` (0 <= target < total)."""
        pos, tree, n, step = 0, self.tree, len(self.values), self._top
        while step:
            nxt = pos + step
            if nxt <= n and tree[nxt] <= target:
                pos = nxt
                target -= tree[nxt]
            step >>= 1
        if pos >= n or self.values[pos] <= 0.0:  # float edge: the nearest weighted entry
            right = next((j for j in range(pos, n) if self.values[j] > 0.0), None)
            if right is not None:
                return right
            return next(j for j in range(min(pos, n - 1), -1, -1) if self.values[j] > 0.0)
        return pos


class _Group:
    """The tasks of one (pack version, split, domain), with their weights."""

    __slots__ = ("active", "domain", "index", "sealed", "split", "tasks", "tree")

    def __init__(self, split: str, domain: str, sealed: bool, tasks: list[Task]) -> None:
        self.split, self.domain, self.sealed, self.tasks = split, domain, sealed, tasks
        self.index = {t.ref: i for i, t in enumerate(tasks)}
        self.tree = _Fenwick([0.0] * len(tasks))
        self.active = 0


@dataclass
class _Stats:
    """One task's running record."""

    window: deque[tuple[bool, float]]  # (passed, reward) of its last verified episodes
    voids: deque[bool]  # True for void, over its last verified-or-void episodes
    passes: int = 0
    reward_sum: float = 0.0
    episodes: int = 0  # verified episodes counted since the server started (history included)
    void_total: int = 0
    last_void: str = ""
    quarantined_since: float | None = None
    quarantined_until: float | None = None
    quarantine_reason: str = ""


@dataclass
class _PlanDomain:
    domain: str
    weight: float
    groups: list[_Group]


@dataclass
class _PlanPack:
    name: str
    version: str
    weight: float
    domains: list[_PlanDomain]
    cum: list[float] = field(default_factory=list)  # over eligible domains
    eligible: list[_PlanDomain] = field(default_factory=list)


@dataclass
class _Plan:
    epoch: int
    packs: list[_PlanPack]
    cum: list[float] = field(default_factory=list)
    eligible: list[_PlanPack] = field(default_factory=list)


class Sampler:
    """Mixture × curriculum × quarantine over the packs of a registry; owned by the manager."""

    def __init__(
        self,
        settings: Settings,
        packs: PackCatalog,
        *,
        clock: Callable[[], float] = time.time,
        unjudged: frozenset[str] = frozenset(),
    ) -> None:
        self.settings = settings
        self.unjudged = unjudged  # families never drawn: a judge they need is unconfigured
        self._unjudged_refs: set[str] = set()
        self._clock = clock
        self.packs = packs
        self.curriculum = settings.sampler_curriculum
        self.alpha = settings.sampler_alpha
        self.floor = settings.sampler_floor
        self.window = settings.sampler_window
        self.weights = dict(settings.sampler_weights)
        self._rng = random.Random()
        self._stats: dict[str, _Stats] = {}
        self._where: dict[str, tuple[_Group, int]] = {}
        self._indices: dict[tuple[str, str], dict[tuple[str, str], _Group]] = {}
        self._signature: tuple[tuple[str, str], ...] = ()
        self._draws: tuple[tuple[tuple[str, str], int], ...] = ()
        self._latest: dict[str, tuple[str, str]] = {}
        self._epoch = 0
        self._plans: dict[tuple[str | None, str | None, str | None], _Plan] = {}
        self._expiry: list[tuple[float, str]] = []
        self._quarantined: set[str] = set()
        self._pack_names: set[str] = set()
        self._held: frozenset[str] = frozenset()
        self._yanked: frozenset[tuple[str, str]] = frozenset()

    # -- index ----------------------------------------------------------------------------
    def refresh(self, now: float | None = None) -> None:
        """Re-index if the served packs changed; release quarantines whose cool-down ended."""
        signature = tuple((p.name, p.version) for p in self.packs.all())
        draws = tuple(sorted(self.packs.draws.items()))  # a held-out rotation (server/draws.py)
        if (signature, self.packs.yanked, draws) != (self._signature, self._yanked, self._draws):
            self._yanked = self.packs.yanked  # a yank changes what `name` resolves to
            self._reindex(signature, {n for (n, _), _ in set(draws) ^ set(self._draws)})
            self._draws = draws
        if self.packs.held != self._held:  # an admin enabled a pack: plans change
            self._held = self.packs.held
            self._bump()
        if self._expiry:
            now = self._clock() if now is None else now
            while self._expiry and self._expiry[0][0] <= now:
                until, ref = heapq.heappop(self._expiry)
                stats = self._stats.get(ref)
                if stats is not None and stats.quarantined_until == until:
                    self._release(ref, stats, "cool-down ended")

    def _reindex(self, signature: tuple[tuple[str, str], ...], stale: set[str]) -> None:
        """Index the pack versions not indexed yet; drop those no longer served or `stale`."""
        started = time.perf_counter()
        self._signature = signature
        self._pack_names = {name for name, _ in signature}
        self._latest = {}
        for name in {n for n, v in signature if not self.packs.is_yanked(n, v)}:
            latest = self.packs.get(name)  # the newest version not yanked
            self._latest[name] = (latest.name, latest.version)
        served = set(signature)
        for key in [k for k in self._indices if k not in served or k[0] in stale]:
            for group in self._indices.pop(key).values():
                for ref in group.index:
                    self._where.pop(ref, None)
        added = 0
        for name, version in signature:
            if (name, version) not in self._indices:
                self._indices[(name, version)] = self._index_pack(name, version)
                added += 1
        self._bump()
        log.info(
            "sampler indexed %d new of %d pack versions (%d tasks) in %.1f ms",
            added,
            len(signature),
            len(self._where),
            (time.perf_counter() - started) * 1000,
        )

    def _index_pack(self, name: str, version: str) -> dict[tuple[str, str], _Group]:
        pack = self.packs.get(name, version)
        by_group: dict[tuple[str, str], list[Task]] = {}
        for task in self.packs.select(pack=f"{name}@{version}"):
            by_group.setdefault((task.split, task.domain), []).append(task)
        groups = {}
        for (split, domain), tasks in by_group.items():
            group = _Group(split, domain, pack.sealed.get(split, False), tasks)
            values = group.tree.values
            for i, task in enumerate(tasks):
                if task.family in self.unjudged:
                    self._unjudged_refs.add(task.ref)
                values[i] = self._weight(task.ref)
                group.active += values[i] > 0.0
                self._where[task.ref] = (group, i)
            group.tree._build()
            groups[(split, domain)] = group
        return groups

    def _bump(self) -> None:
        self._epoch += 1
        self._plans.clear()

    # -- weights --------------------------------------------------------------------------
    def _p(self, stats: _Stats | None) -> float:
        if stats is None:
            return 0.5
        return (stats.passes + 1.0) / (len(stats.window) + 2.0)

    def _weight(self, ref: str) -> float:
        if ref in self._unjudged_refs:
            return 0.0
        stats = self._stats.get(ref)
        if stats is not None and stats.quarantined_since is not None:
            return 0.0
        if not self.curriculum:
            return 1.0
        return curriculum_weight(self._p(stats), self.alpha, self.floor)

    def pack_weight(self, name: str, version: str) -> float:
        w = self.weights.get(f"{name}@{version}")
        return self.weights.get(name, 1.0) if w is None else w

    def domain_weight(self, domain: str) -> float:
        """The longest key (not a pack name) equal to `domain` or a `/`-prefix of it; else 1."""
        probe = domain
        while True:
            if probe in self.weights and probe not in self._pack_names:
                return self.weights[probe]
            cut = probe.rfind("/")
            if cut <= 0:
                return 1.0
            probe = probe[:cut]

    def _set_weight(self, ref: str) -> None:
        found = self._where.get(ref)
        if found is None:
            return
        group, i = found
        old = group.tree.values[i]
        new = self._weight(ref)
        group.tree.set(i, new)
        if (old > 0.0) != (new > 0.0):
            group.active += 1 if new > 0.0 else -1
            self._bump()

    # -- outcomes -------------------------------------------------------------------------
    def _stats_for(self, ref: str) -> _Stats:
        stats = self._stats.get(ref)
        if stats is None:
            stats = _Stats(
                window=deque(maxlen=self.window),
                voids=deque(maxlen=self.settings.sampler_void_window),
            )
            self._stats[ref] = stats
        return stats

    def record(
        self,
        task_ref: str,
        status: str,
        reward: float,
        passed: bool,
        *,
        reason: str | None = None,
        at: float | None = None,
    ) -> None:
        """An episode of `task_ref` ended: `done` counts toward its success rate, `void`
        toward quarantine; anything else (closed, expired) and server-caused voids are ignored."""
        if status == "done":
            stats = self._stats_for(task_ref)
            if len(stats.window) == stats.window.maxlen:
                old_passed, old_reward = stats.window[0]
                stats.passes -= old_passed
                stats.reward_sum -= old_reward
            stats.window.append((passed, reward))
            stats.passes += passed
            stats.reward_sum += reward
            stats.episodes += 1
            stats.voids.append(False)
            if stats.quarantined_since is None and self.curriculum:
                self._set_weight(task_ref)
        elif status == "void" and (reason or "") not in LIFECYCLE_VOIDS:
            stats = self._stats_for(task_ref)
            stats.voids.append(True)
            stats.void_total += 1
            stats.last_void = reason or "void"
            voids = sum(stats.voids)
            if stats.quarantined_since is None and voids >= self.settings.sampler_void_limit:
                self._quarantine(task_ref, stats, voids, self._clock() if at is None else at)

    def _quarantine(self, ref: str, stats: _Stats, voids: int, at: float) -> None:
        stats.quarantined_since = at
        stats.quarantine_reason = (
            f"{voids} of its last {len(stats.voids)} episodes ended void (last: {stats.last_void})"
        )
        cool_down = self.settings.sampler_quarantine_s
        stats.quarantined_until = at + cool_down if cool_down > 0 else None
        if stats.quarantined_until is not None:
            heapq.heappush(self._expiry, (stats.quarantined_until, ref))
        self._quarantined.add(ref)
        log.warning("task quarantined: %s: %s", ref, stats.quarantine_reason)
        self._set_weight(ref)

    def _release(self, ref: str, stats: _Stats, why: str) -> None:
        stats.quarantined_since = stats.quarantined_until = None
        stats.quarantine_reason = ""
        stats.voids.clear()  # on probation: it takes `void_limit` fresh voids to return
        self._quarantined.discard(ref)
        log.warning("task released from quarantine: %s (%s)", ref, why)
        self._set_weight(ref)

    def release(self, task_ref: str, *, at: float | None = None) -> bool:
        """Release a quarantined task now; False when it was not quarantined."""
        stats = self._stats.get(task_ref)
        if stats is None or stats.quarantined_since is None:
            return False
        if at is not None and stats.quarantined_since > at:
            return False  # replay: a release older than this quarantine
        self._release(task_ref, stats, "released by an admin")
        return True

    def replay(self, history: Iterable[tuple[float, str, str, float, bool, str | None]]) -> None:
        """Rebuild from stored episodes, oldest first: (ended_at, task, status, reward, passed,
        void_reason); a status `release` is an admin release at that time."""
        for at, ref, status, reward, passed, reason in history:
            if status == "release":
                self.release(ref, at=at)
            else:
                self.record(ref, status, reward, passed, reason=reason, at=at)

    def quarantined_count(self) -> int:
        return len(self._quarantined)

    def quarantine_note(self, task_ref: str) -> str | None:
        """Why `task_ref` is quarantined (an explicit reset still runs it), or None."""
        stats = self._stats.get(task_ref)
        if stats is None or stats.quarantined_since is None:
            return None
        return stats.quarantine_reason

    # -- sampling -------------------------------------------------------------------------
    def _plan(self, pack: str | None, split: str | None, domain: str | None) -> _Plan:
        key = (pack, split, domain)
        plan = self._plans.get(key)
        if plan is not None:
            return plan
        if pack:
            chosen = self.packs.get(pack)  # 404 for an unknown pack or version
            versions = [(chosen.name, chosen.version)]
        else:
            # Unfiltered: only packs an admin enabled (a new published pack is held).
            versions = [
                self._latest[name] for name in sorted(self._latest) if self.packs.sampled(name)
            ]
        plan_packs = []
        for name, version in versions:
            by_domain: dict[str, list[_Group]] = {}
            for group in self._indices.get((name, version), {}).values():
                if (split is None and group.sealed) or (split is not None and group.split != split):
                    continue
                d = group.domain
                if domain is not None and not (d == domain or d.startswith(domain + "/")):
                    continue
                by_domain.setdefault(d, []).append(group)
            if by_domain:
                domains = [
                    _PlanDomain(d, self.domain_weight(d), by_domain[d]) for d in sorted(by_domain)
                ]
                plan_packs.append(
                    _PlanPack(name, version, self.pack_weight(name, version), domains)
                )
        plan = _Plan(self._epoch, plan_packs)
        for pp in plan_packs:
            pp.eligible = [
                d for d in pp.domains if d.weight > 0 and any(g.active for g in d.groups)
            ]
            pp.cum = list(itertools.accumulate(d.weight for d in pp.eligible))
        plan.eligible = [pp for pp in plan_packs if pp.weight > 0 and pp.eligible]
        plan.cum = list(itertools.accumulate(pp.weight for pp in plan.eligible))
        if len(self._plans) >= PLAN_CACHE:
            self._plans.clear()
        self._plans[key] = plan
        return plan

    def sample(
        self,
        seed: int | random.Random | None = None,
        *,
        pack: str | None = None,
        split: str | None = None,
        domain: str | None = None,
    ) -> tuple[Task, float]:
        """Draw a task; returns it with the probability it had of being drawn.

        The same `seed` and the same sampler state give the same task."""
        self.refresh()
        if isinstance(seed, random.Random):
            rng = seed
        else:
            rng = self._rng if seed is None else random.Random(seed)
        plan = self._plan(pack, split, domain)
        if not plan.eligible:
            shown = {k: v for k, v in (("pack", pack), ("split", split), ("domain", domain)) if v}
            why = (
                "every matching task is quarantined, weighted 0, or of a family whose judge "
                "endpoint is not configured (Settings.judges)"
                if plan.packs
                else "no task matches"
            )
            hint = "" if split else " (sealed splits are drawn from only when named by `split`)"
            warming = (
                None
                if plan.packs
                else self.packs.warming_error(f"no ready task matches {shown or 'any filter'}")
            )
            if warming is not None:  # a pack generated in the background may match
                raise warming
            raise NotFoundError(f"nothing to sample: {why} {shown or 'any filter'}{hint}")
        pp = plan.eligible[_pick(plan.cum, rng.random())]
        pd = pp.eligible[_pick(pp.cum, rng.random())]
        p_mix = (pp.weight / plan.cum[-1]) * (pd.weight / pp.cum[-1])
        u = rng.random()
        if len(pd.groups) == 1:
            group = pd.groups[0]
            total = group.tree.total()
            target = u * total
        else:  # the domain spans several splits: pick one by its share of the mass
            totals = [g.tree.total() if g.active else 0.0 for g in pd.groups]
            total = sum(totals)
            target = u * total
            k = max(j for j, t in enumerate(totals) if t > 0.0)
            for j, t in enumerate(totals):
                if target < t:
                    k = j
                    break
                target -= t
            group = pd.groups[k]
        i = group.tree.find(target)
        return group.tasks[i], p_mix * group.tree.values[i] / total

    # -- report ---------------------------------------------------------------------------
    def report(
        self,
        *,
        pack: str | None = None,
        split: str | None = None,
        domain: str | None = None,
        limit: int = 1000,
        sealed: bool = True,
    ) -> SamplerReport:
        """`sealed=False` (a token without `eval`): nothing per task of a sealed split, in
        tasks, counts or quarantine (its results are the evaluators' alone)."""
        self.refresh()
        plan = self._plan(pack, split, domain)
        hidden: set[str] = set() if sealed else self._sealed_refs()
        total_pack = plan.cum[-1] if plan.cum else 0.0
        packs: list[SamplerPackInfo] = []
        tasks: list[SamplerTaskInfo] = []
        eligible_packs = {id(pp) for pp in plan.eligible}
        for pp in plan.packs:
            eligible_domains = {id(pd) for pd in pp.eligible}
            p_pack = pp.weight / total_pack if id(pp) in eligible_packs else 0.0
            total_domain = pp.cum[-1] if pp.cum else 0.0
            domains = []
            for pd in pp.domains:
                eligible = id(pd) in eligible_domains
                p_domain = p_pack * pd.weight / total_domain if eligible and total_domain else 0.0
                mass = sum(g.tree.total() for g in pd.groups)
                count = seen = quarantined = 0
                for group in pd.groups:
                    if group.sealed and not sealed:
                        continue
                    count += len(group.tasks)
                    quarantined += len(group.tasks) - group.active
                    for task in group.tasks:
                        stats = self._stats.get(task.ref)
                        if stats is None:
                            continue
                        seen += 1
                        w = group.tree.values[group.index[task.ref]]
                        prob = p_domain * w / mass if mass else 0.0
                        tasks.append(self._task_info(task, stats, w, prob))
                domains.append(
                    SamplerDomainInfo(
                        domain=pd.domain,
                        weight=pd.weight,
                        probability=p_domain,
                        tasks=count,
                        seen=seen,
                        quarantined=quarantined,
                    )
                )
            packs.append(
                SamplerPackInfo(
                    pack=f"{pp.name}@{pp.version}",
                    weight=pp.weight,
                    probability=p_pack,
                    domains=domains,
                )
            )
        tasks.sort(key=lambda t: t.task)
        known = self._pack_names | {f"{n}@{v}" for n, v in self._signature}
        domains_served = {g.domain for groups in self._indices.values() for g in groups.values()}
        unmatched = [
            k
            for k in sorted(self.weights)
            if k not in known and not any(d == k or d.startswith(k + "/") for d in domains_served)
        ]
        return SamplerReport(
            curriculum=self.curriculum,
            rule=RULE,
            alpha=self.alpha,
            floor=self.floor,
            window=self.window,
            void_limit=self.settings.sampler_void_limit,
            void_window=self.settings.sampler_void_window,
            quarantine_s=self.settings.sampler_quarantine_s,
            filters={k: v for k, v in (("pack", pack), ("split", split), ("domain", domain)) if v},
            packs=packs,
            tasks=tasks[:limit],
            tasks_seen=len(tasks),
            quarantined=[self._quarantine_info(ref) for ref in sorted(self._quarantined - hidden)],
            unmatched_weights=unmatched,
        )

    def _sealed_refs(self) -> set[str]:
        return {
            task.ref
            for groups in self._indices.values()
            for group in groups.values()
            if group.sealed
            for task in group.tasks
        }

    def _task_info(self, task: Task, stats: _Stats, weight: float, prob: float) -> SamplerTaskInfo:
        n = len(stats.window)
        return SamplerTaskInfo(
            task=task.ref,
            domain=task.domain,
            split=task.split,
            n=n,
            passes=stats.passes,
            success_rate=self._p(stats),
            mean_reward=stats.reward_sum / n if n else None,
            episodes=stats.episodes,
            voids=sum(stats.voids),
            weight=weight,
            probability=prob,
            quarantined=stats.quarantined_since is not None,
        )

    def _quarantine_info(self, ref: str) -> QuarantinedTask:
        stats = self._stats[ref]
        return QuarantinedTask(
            task=ref,
            reason=stats.quarantine_reason,
            voids=sum(stats.voids),
            since=stats.quarantined_since or 0.0,
            until=stats.quarantined_until,
        )


def _pick(cum: list[float], u: float) -> int:
    return min(bisect.bisect_right(cum, u * cum[-1]), len(cum) - 1)
