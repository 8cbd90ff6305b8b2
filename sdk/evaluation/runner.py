"""Running attempts: one attempt's reset, act/step loop and verify (`run_attempt`), and k
attempts a task in memory (`run_eval`). Faults of the policy or the server are classed,
never raised."""

from __future__ import annotations

import asyncio
import contextlib
import time
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
from palaestra.sdk.evaluation.attempt import (
    Attempt,
    AttemptLimits,
    ProgressCallback,
    observation_json,
)
from palaestra.sdk.models import Action, Observation, StepResponse, TaskInfo
from palaestra.sdk.policies.base import Policy, PolicyError, Session, session_usage


class ResetUnreachable(Exception):
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
    except `ResetUnreachable` when the server could not be reached to start it."""
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
        raise ResetUnreachable(exc.message) from None
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
    draw = reset.info.get("heldout_draw")  # which held-out set this attempt measured
    result.draw = draw if isinstance(draw, int) else None
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
                observation=observation_json(reply.observation),
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
            except ResetUnreachable as exc:
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
