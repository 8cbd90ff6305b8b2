"""Run a policy over a split, k attempts a task, into a run directory that survives crashes
(DESIGN §8).

Works against any `AsyncClient`, HTTP or in-process. Seeds are fixed: attempt i of a task
uses seed i. Each attempt is held to limits (steps, tokens, wall time). Outcomes:
- `ok`: verified; the reward counts (a policy that ran out of time or tokens is verified
  as it stands, with `error_class` timeout / token_limit);
- `error`: the policy failed (endpoint unreachable, garbage reply, exception): reward 0,
  counted in the mean, classed by `error_class`;
- `void`: an infrastructure fault (sandbox died, verifier crashed, the server went away
  or restarted): never scored 0, reported apart, and rerun by `palaestra eval resume`.

A run directory holds `manifest.json` (what was run) and `attempts.jsonl` (one line per
finished attempt, appended and fsynced before the next is counted). Resuming runs only the
attempts without a line (and, by default, those that ended void); a later line for the same
(task, attempt) supersedes an earlier one, which stays in the file.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from palaestra.sdk.client import AsyncClient
from palaestra.sdk.errors import (
    AuthenticationError,
    CapacityError,
    ConflictError,
    InvalidActionError,
    NotFoundError,
    PalaestraError,
    PermissionDeniedError,
    ServerError,
    TransportError,
    UnavailableError,
)
from palaestra.sdk.models import Action, Observation, StepResponse, TaskInfo
from palaestra.sdk.policies import Policy, PolicyError, Session, session_usage

RUN_FORMAT = "palaestra-run/1"
MANIFEST = "manifest.json"
ATTEMPTS = "attempts.jsonl"
OBSERVATION_CHARS = 8000  # an observation's text kept in a stored trajectory

# error_class → what kind of failure it is (the report groups failures by these)
INFRA_CLASSES = frozenset({"env_error", "server_unreachable", "server_error", "server_busy"})


@dataclass(frozen=True)
class AttemptLimits:
    """Per-attempt limits; 0 tokens means no token limit."""

    max_steps: int = 30
    max_tokens: int = 0
    max_wall_s: float = 600.0

    @property
    def hard_timeout_s(self) -> float:
        """The client's own deadline: the server truncates at max_wall_s; this catches a
        policy that hangs between steps."""
        return self.max_wall_s + min(30.0, max(1.0, self.max_wall_s / 4))


@dataclass
class Attempt:
    task: str
    family: str
    domain: str
    difficulty: str
    attempt: int
    seed: int
    episode_id: str = ""
    task_digest: str = ""
    status: str = "ok"  # ok | void | error
    reward: float = 0.0
    passed: bool = False
    error_class: str = ""
    error: str = ""
    stop: str = ""  # terminated | truncated | timeout | token_limit | error | void
    steps: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    tokens_prompt: int = 0
    tokens_completion: int = 0
    duration_s: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)  # reset_s policy_s env_s verify_s
    feedback: str = ""
    components: dict[str, float] = field(default_factory=dict)
    verifier: dict[str, str] = field(default_factory=dict)
    process: dict[str, Any] = field(default_factory=dict)  # the server's metrics, if any
    options: dict[str, Any] = field(default_factory=dict)  # the reset options (for replay)
    trajectory: list[dict[str, Any]] = field(default_factory=list)
    finished_at: float = 0.0
    regraded: dict[str, Any] = field(default_factory=dict)  # set by `eval report`, not stored

    @property
    def key(self) -> tuple[str, int]:
        return (self.task, self.attempt)

    @property
    def tokens(self) -> int:
        return self.tokens_prompt + self.tokens_completion

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Attempt:
        """Tolerant of fields added later (ignored) and missing ones (defaults)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


ProgressCallback = Callable[[Attempt], None]


class ServerGone(Exception):
    """The server stayed unreachable; the run stopped and can be resumed."""


class _ResetUnreachable(Exception):
    """The reset never reached the server: nothing started, nothing to record."""


def _classify(exc: PalaestraError) -> tuple[str, str]:
    """(status, error_class) for a server error met mid-attempt."""
    if isinstance(exc, TransportError):
        return "void", "server_unreachable"
    if isinstance(exc, CapacityError):
        return "void", "server_busy"
    if isinstance(exc, ConflictError | NotFoundError):
        # The episode ended or vanished under us: the server restarted (it voids the
        # episodes it held) or the episode expired.
        return "void", "env_error"
    if isinstance(exc, ServerError | UnavailableError):
        return "void", "server_error"
    return "error", f"server_{exc.code}"


def _observation_json(observation: Observation) -> dict[str, Any]:
    text = observation.text
    if len(text) > OBSERVATION_CHARS:
        text = text[:OBSERVATION_CHARS] + f"\n[… {len(observation.text) - OBSERVATION_CHARS} chars]"
    return {"text": text, "images": len(observation.images)}


def _process_metrics(*sources: Any) -> dict[str, Any]:
    """Per-episode process metrics where the server reports them (state or final info)."""
    for source in sources:
        if not isinstance(source, dict):
            continue
        for key in ("metrics", "process", "process_metrics"):
            value = source.get(key)
            if isinstance(value, dict) and value:
                return value
    return {}


async def run_attempt(
    client: AsyncClient,
    policy: Policy,
    task: TaskInfo,
    attempt: int,
    *,
    max_steps: int = 50,
    limits: AttemptLimits | None = None,
    seed: int | None = None,
) -> Attempt:
    """One attempt; never raises for the policy's or the server's faults (it classes them),
    except `_ResetUnreachable` when the server could not be reached to start it."""
    limits = limits or AttemptLimits(max_steps=max_steps)
    seed = attempt if seed is None else seed
    result = Attempt(
        task=task.id,
        family=task.family,
        domain=task.domain,
        difficulty=task.difficulty,
        attempt=attempt,
        seed=seed,
    )
    started = time.perf_counter()
    options = {
        **policy.reset_options(),
        "max_steps": limits.max_steps,
        "max_wall_s": limits.max_wall_s,
    }
    result.options = options
    try:
        reset = await client.reset(task.id, seed=seed, options=options)
    except TransportError as exc:
        raise _ResetUnreachable(exc.message) from None
    except (AuthenticationError, PermissionDeniedError):
        raise  # the whole run is refused (a token without the scope): stop, record nothing
    except PalaestraError as exc:
        status, error_class = _classify(exc)
        result.status, result.stop = status, "void" if status == "void" else "error"
        result.error_class = error_class if status == "void" else f"reset_{exc.code}"
        result.error = exc.message
        result.duration_s = time.perf_counter() - started
        result.finished_at = time.time()
        return result
    result.phases["reset_s"] = time.perf_counter() - started
    result.episode_id = reset.episode_id
    result.task_digest = str(reset.info.get("task_digest", ""))
    reset.info.setdefault("seed", seed)  # policies seed their sampling from it
    session: Session | None = None
    try:
        try:
            async with asyncio.timeout(limits.hard_timeout_s):
                session = await policy.start(reset)
                last = await _play(client, session, reset.episode_id, result, limits)
        except TimeoutError:
            result.stop, result.error_class = "timeout", "timeout"
            result.error = f"the attempt ran past its wall-time limit ({limits.max_wall_s:g} s)"
            last = None
        if session is not None:
            _count_tokens(result, session)
        verify_started = time.perf_counter()
        verdict = await client.verify(reset.episode_id)
        result.phases["verify_s"] = time.perf_counter() - verify_started
        result.reward, result.passed = verdict.reward, verdict.passed
        result.feedback, result.components = verdict.feedback, verdict.components
        result.verifier = verdict.verifier.model_dump(mode="json")
        result.task_digest = verdict.task_digest or result.task_digest
        if verdict.status == "void":
            result.status, result.stop = "void", "void"
            result.error_class, result.error = "env_error", verdict.feedback
        state = await client.state(reset.episode_id)
        if state.timings:
            result.phases.update({f"server_{k}": v for k, v in state.timings.items()})
        result.process = _process_metrics(
            state.model_dump(mode="json"), last.info if last is not None else None
        )
    except PolicyError as exc:
        result.status, result.stop = "error", "error"
        result.error_class, result.error = exc.error_class, str(exc)
    except PalaestraError as exc:
        result.status, result.error_class = _classify(exc)
        result.stop = "void" if result.status == "void" else "error"
        result.error = exc.message
    except Exception as exc:  # a policy bug must not take the run down
        result.status, result.stop = "error", "error"
        result.error_class, result.error = "policy_error", f"{type(exc).__name__}: {exc}"[:500]
    finally:
        if session is not None:
            _count_tokens(result, session)
            with contextlib.suppress(Exception):
                await session.aclose()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(client.close(reset.episode_id), 5.0)
        result.duration_s = time.perf_counter() - started
        result.finished_at = time.time()
    if result.status != "ok":
        result.reward, result.passed = 0.0, False
    return result


def _count_tokens(result: Attempt, session: Session) -> None:
    usage = session_usage(session)
    result.tokens_prompt = usage.get("prompt_tokens", result.tokens_prompt)
    result.tokens_completion = usage.get("completion_tokens", result.tokens_completion)


async def _play(
    client: AsyncClient, session: Session, episode_id: str, result: Attempt, limits: AttemptLimits
) -> StepResponse | None:
    """The act/step loop; ends when the episode does or a limit is hit."""
    last: StepResponse | None = None
    policy_s = env_s = 0.0
    try:
        # Refused (422) actions do not count as steps on the server; bound them here too.
        for _ in range(limits.max_steps * 2 + 2):
            t0 = time.perf_counter()
            try:
                action = await session.act(last)
            except PolicyError:
                raise
            except Exception as exc:
                raise PolicyError(
                    f"the policy raised {type(exc).__name__}: {exc}"[:500], "policy_error"
                ) from None
            if not isinstance(action, Action):
                raise PolicyError(f"the policy returned {action!r:.200}", "bad_policy_output")
            act_s = time.perf_counter() - t0
            policy_s += act_s
            result.tool_calls += 1
            _count_tokens(result, session)
            entry: dict[str, Any] = {
                "index": len(result.trajectory),
                "action": action.model_dump(mode="json"),
                "policy_s": round(act_s, 6),
                "tokens": result.tokens,
            }
            result.trajectory.append(entry)
            if limits.max_tokens and result.tokens > limits.max_tokens:
                entry["error"] = f"token limit of {limits.max_tokens} reached; not sent"
                result.stop, result.error_class = "token_limit", "token_limit"
                result.error = f"the policy used {result.tokens} tokens (limit {limits.max_tokens})"
                return last
            t1 = time.perf_counter()
            try:
                reply = await client.step(episode_id, action)
            except InvalidActionError as exc:
                env_s += time.perf_counter() - t1
                result.tool_errors += 1
                entry["error"] = exc.message
                entry["env_s"] = round(time.perf_counter() - t1, 6)
                last = StepResponse(observation=Observation(text=f"error: {exc.message}"))
                continue
            step_s = time.perf_counter() - t1
            env_s += step_s
            last = reply
            result.steps += 1
            entry.update(
                observation=_observation_json(reply.observation),
                reward=reply.reward,
                terminated=reply.terminated,
                truncated=reply.truncated,
                env_s=round(step_s, 6),
                accepted=True,
            )
            if reply.info.get("status") == "void":
                entry["void_reason"] = reply.info.get("void_reason", "")
            if reply.terminated or reply.truncated:
                result.stop = "terminated" if reply.terminated else "truncated"
                return last
        result.stop = "truncated"
        return last
    finally:
        result.phases["policy_s"] = policy_s
        result.phases["env_s"] = env_s


async def run_eval(
    client: AsyncClient,
    policy: Policy,
    tasks: list[TaskInfo],
    *,
    k: int = 1,
    concurrency: int = 8,
    max_steps: int = 50,
    limits: AttemptLimits | None = None,
    on_attempt: ProgressCallback | None = None,
) -> list[Attempt]:
    """k attempts a task, in memory (no run directory)."""
    limits = limits or AttemptLimits(max_steps=max_steps)
    gate = asyncio.Semaphore(concurrency)

    async def one(task: TaskInfo, i: int) -> Attempt:
        async with gate:
            try:
                attempt = await run_attempt(client, policy, task, i, limits=limits)
            except _ResetUnreachable as exc:
                attempt = Attempt(
                    task=task.id,
                    family=task.family,
                    domain=task.domain,
                    difficulty=task.difficulty,
                    attempt=i,
                    seed=i,
                    status="void",
                    stop="void",
                    error_class="server_unreachable",
                    error=str(exc),
                    finished_at=time.time(),
                )
        if on_attempt is not None:
            on_attempt(attempt)
        return attempt

    return list(await asyncio.gather(*(one(t, i) for t in tasks for i in range(k))))


# -- the run directory ---------------------------------------------------------------------------


class RunError(Exception):
    """A run directory that cannot be used as asked; the message says why."""


class RunDir:
    """`manifest.json` + `attempts.jsonl` (append-only, fsynced line by line)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    @property
    def manifest_path(self) -> Path:
        return self.path / MANIFEST

    @property
    def attempts_path(self) -> Path:
        return self.path / ATTEMPTS

    @classmethod
    def create(cls, path: Path, manifest: dict[str, Any]) -> RunDir:
        if (path / MANIFEST).exists():
            raise RunError(
                f"{path} already holds a run; continue it with `palaestra eval resume {path}` "
                "or choose another --run-dir"
            )
        path.mkdir(parents=True, exist_ok=True)
        run = cls(path)
        run.write_manifest({"format": RUN_FORMAT, **manifest})
        run.attempts_path.touch()
        return run

    @classmethod
    def open(cls, path: Path) -> RunDir:
        if not (path / MANIFEST).is_file():
            raise RunError(f"{path} is not a run directory (no {MANIFEST})")
        run = cls(path)
        fmt = run.manifest().get("format")
        if fmt != RUN_FORMAT:
            raise RunError(
                f"{path}: unknown run format {fmt!r} (this palaestra reads {RUN_FORMAT})"
            )
        return run

    def manifest(self) -> dict[str, Any]:
        try:
            data = json.loads(self.manifest_path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise RunError(f"{self.manifest_path} is unreadable: {exc}") from None
        if not isinstance(data, dict):
            raise RunError(f"{self.manifest_path} is not a JSON object")
        return data

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        """Atomically: a crash leaves the old manifest or the new one, never half of one."""
        tmp = self.manifest_path.with_suffix(".json.tmp")
        with open(tmp, "w") as f:
            json.dump(manifest, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.manifest_path)
        _fsync_dir(self.path)

    def update_manifest(self, **changes: Any) -> dict[str, Any]:
        manifest = self.manifest()
        manifest.update(changes)
        self.write_manifest(manifest)
        return manifest

    def repair(self) -> int:
        """Cut a torn last line (a crash mid-write); returns the bytes cut."""
        if not self.attempts_path.exists():
            self.attempts_path.touch()
            return 0
        data = self.attempts_path.read_bytes()
        if not data or data.endswith(b"\n"):
            return 0
        keep = data.rfind(b"\n") + 1
        with open(self.attempts_path, "r+b") as f:
            f.truncate(keep)
            f.flush()
            os.fsync(f.fileno())
        return len(data) - keep

    def append(self, attempt: Attempt) -> None:
        """One line, written and fsynced before it returns."""
        line = (json.dumps(attempt.to_json(), separators=(",", ":")) + "\n").encode()
        with self._lock, open(self.attempts_path, "ab") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())

    def records(self) -> list[Attempt]:
        """Every stored line, in order (a torn or unreadable line is skipped)."""
        out: list[Attempt] = []
        if not self.attempts_path.exists():
            return out
        for raw in self.attempts_path.read_text().splitlines():
            if not raw.strip():
                continue
            try:
                data = json.loads(raw)
            except json.JSONDecodeError:
                continue
            if isinstance(data, dict):
                out.append(Attempt.from_json(data))
        return out

    def latest(self) -> dict[tuple[str, int], Attempt]:
        """The last line per (task, attempt): what the report counts."""
        return {a.key: a for a in self.records()}


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def pending(
    tasks: Iterable[TaskInfo],
    k: int,
    done: dict[tuple[str, int], Attempt],
    *,
    retry_void: bool,
    retry_errors: bool = False,
) -> list[tuple[TaskInfo, int]]:
    """The (task, attempt) pairs still to run, in a fixed order."""
    rerun = {"void"} if retry_void else set()
    if retry_errors:
        rerun.add("error")
    todo = []
    for task in tasks:
        for i in range(k):
            prior = done.get((task.id, i))
            if prior is None or prior.status in rerun:
                todo.append((task, i))
    return todo


async def wait_for_server(client: AsyncClient, patience_s: float) -> bool:
    """Poll a cheap route until the server answers again, or `patience_s` passes."""
    deadline = time.monotonic() + patience_s
    delay = 0.2
    while True:
        try:
            await client.packs()
            return True
        except TransportError:
            pass
        except PalaestraError:
            return True  # it answers, even if with an error
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(delay * 2, 2.0)


async def run_suite(
    client: AsyncClient,
    policy: Policy,
    run: RunDir,
    tasks: list[TaskInfo],
    *,
    k: int,
    concurrency: int = 4,
    limits: AttemptLimits | None = None,
    retry_void: bool = True,
    retry_errors: bool = False,
    server_patience_s: float = 60.0,
    on_attempt: ProgressCallback | None = None,
) -> list[Attempt]:
    """Run what the run directory lacks; each finished attempt is on disk before it counts.

    An attempt whose reset cannot reach the server is not recorded: the runner waits for
    the server (up to `server_patience_s`) and starts it again; if the server stays away,
    `ServerGone` is raised and the run can be resumed later. Attempts cut off mid-episode
    by a server restart end `void` (class env_error / server_unreachable) and are rerun by
    a resume."""
    limits = limits or AttemptLimits()
    run.repair()
    todo = pending(tasks, k, run.latest(), retry_void=retry_void, retry_errors=retry_errors)
    gate = asyncio.Semaphore(concurrency)
    waiting = asyncio.Lock()
    finished: list[Attempt] = []

    async def one(task: TaskInfo, i: int) -> None:
        async with gate:
            while True:
                try:
                    attempt = await run_attempt(client, policy, task, i, limits=limits)
                    break
                except _ResetUnreachable as exc:
                    async with waiting:
                        back = await wait_for_server(client, server_patience_s)
                    if not back:
                        raise ServerGone(
                            f"the server stayed unreachable for {server_patience_s:g} s ({exc})"
                        ) from None
        await asyncio.to_thread(run.append, attempt)
        finished.append(attempt)
        if on_attempt is not None:
            on_attempt(attempt)

    try:
        async with asyncio.TaskGroup() as group:
            for task, i in todo:
                group.create_task(one(task, i))
    except ExceptionGroup as group_error:
        for kind in (ServerGone, PalaestraError):
            found = group_error.subgroup(kind)
            if found is not None:
                first = found.exceptions[0]
                while isinstance(first, ExceptionGroup):
                    first = first.exceptions[0]
                raise first from None
        raise
    return finished


# -- statistics shared by the report ---------------------------------------------------------------


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al. 2021): 1 - C(n-c, k) / C(n, k)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def build_report(attempts: list[Attempt], *, k: int, header: dict[str, Any]) -> dict[str, Any]:
    """The report of DESIGN §8 (see palaestra.sdk.report)."""
    from palaestra.sdk.report import build_report as build

    return build(attempts, k=k, header=header)


# -- regrading from stored trajectories ----------------------------------------------------------


async def replay_attempt(client: AsyncClient, a: Attempt) -> dict[str, Any]:
    """Regrade one attempt: replay its accepted actions in a fresh episode (same task, seed
    and reset options) and verify. The verdict stands only if every replayed observation
    equals the stored one (the final state is then the same, and the verifier is
    deterministic on it, DESIGN §4); otherwise, or for attempts that never reached a
    verdict, the stored verdict is kept and the reason given."""
    if a.status != "ok":
        return {"graded": "stored", "why": f"{a.status} attempt ({a.error_class or 'no verdict'})"}
    steps = [s for s in a.trajectory if s.get("accepted")]
    if len(steps) != a.steps:
        return {"graded": "stored", "why": "the stored trajectory is incomplete"}
    try:
        reset = await client.reset(a.task, seed=a.seed, options=a.options)
    except PalaestraError as exc:
        return {"graded": "stored", "why": f"replay refused: {exc.code}: {exc.message}"[:300]}
    try:
        digest = str(reset.info.get("task_digest", ""))
        if a.task_digest and digest and digest != a.task_digest:
            return {"graded": "stored", "why": "the task changed since the run (digest differs)"}
        for s in steps:
            reply = await client.step(reset.episode_id, s["action"])
            if _observation_json(reply.observation)["text"] != s["observation"]["text"]:
                return {
                    "graded": "stored",
                    "why": f"replay diverged at step {s['index']} (non-deterministic environment)",
                }
        verdict = await client.verify(reset.episode_id)
        if verdict.status == "void":
            return {"graded": "stored", "why": f"void on replay: {verdict.feedback}"[:300]}
        return {
            "graded": "replay",
            "reward": verdict.reward,
            "passed": verdict.passed,
            "components": verdict.components,
            "verifier": verdict.verifier.model_dump(mode="json"),
            "changed": verdict.reward != a.reward or verdict.passed != a.passed,
            "stored_reward": a.reward,
        }
    except PalaestraError as exc:
        return {"graded": "stored", "why": f"replay failed: {exc.code}: {exc.message}"[:300]}
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(client.close(reset.episode_id), 5.0)


async def regrade(
    client: AsyncClient,
    attempts: list[Attempt],
    *,
    concurrency: int = 4,
    on_attempt: Callable[[Attempt, dict[str, Any]], None] | None = None,
) -> tuple[list[Attempt], dict[str, Any]]:
    """Every attempt regraded where it can be; (attempts with the new verdicts, a summary)."""
    gate = asyncio.Semaphore(concurrency)

    async def one(a: Attempt) -> tuple[Attempt, dict[str, Any]]:
        async with gate:
            outcome = await replay_attempt(client, a)
        if on_attempt is not None:
            on_attempt(a, outcome)
        return a, outcome

    results = await asyncio.gather(*(one(a) for a in attempts))
    out: list[Attempt] = []
    reasons: dict[str, int] = {}
    regraded = changed = 0
    for a, outcome in results:
        b = dataclasses.replace(a)
        if outcome["graded"] == "replay":
            regraded += 1
            changed += bool(outcome["changed"])
            b.reward, b.passed = outcome["reward"], outcome["passed"]
            b.components, b.verifier = outcome["components"], outcome["verifier"]
        else:
            reasons[outcome["why"]] = reasons.get(outcome["why"], 0) + 1
        b.regraded = outcome
        out.append(b)
    summary = {
        "mode": "replay" if regraded else "stored",
        "regraded": regraded,
        "changed": changed,
        "kept_stored": len(attempts) - regraded,
        "kept_reasons": reasons,
        "note": (
            f"{regraded} of {len(attempts)} attempts regraded by replaying their stored "
            f"trajectories ({changed} changed); {len(attempts) - regraded} kept their stored "
            "verdicts"
        ),
    }
    return out, summary
