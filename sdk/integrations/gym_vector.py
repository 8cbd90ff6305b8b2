"""A Gymnasium `VectorEnv` of N palaestra episodes driven through the batch routes.

    envs = PalaestraVectorEnv(HTTPClient(url), ["palaestra/echo:say-birch"] * 8)
    obs, infos = envs.reset(seed=0)               # one POST /v1/batch/reset
    obs, rewards, terminated, truncated, infos = envs.step(actions)   # one /v1/batch/step

Observations and actions are tuples of strings (sdk/gym.py's text spaces, batched the way
Gymnasium batches `Text`); an action is a JSON tool call, and one that is not valid JSON or
that the server refuses as malformed (422) is not a step (the observation says why, the
reward is 0). Infos are Gymnasium's dicts of arrays with `_key` masks.

Autoreset is `SAME_STEP`: a sub-env whose episode ends starts its next episode in the same
`step` call, so every action the policy generated is sent to an episode. Its observation is
the new episode's first one, `infos["final_obs"][i]` and `infos["final_info"][i]` hold the
ended episode's last observation and info (its verdict), and the other info keys at `i` are
the new episode's reset info. A sub-episode that cannot start or step (429 at capacity, a
404, a 409) raises that typed error naming the sub-env; call `reset()` before going on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from palaestra.sdk.client import Client
from palaestra.sdk.errors import PalaestraError, error_from_response
from palaestra.sdk.gym import MAX_TEXT, AnyText, invalid_observation, parse_action, reset_info
from palaestra.sdk.models import BatchItemError, BatchStepItem, ResetRequest, StepResponse

Texts = tuple[str, ...]
Bools = npt.NDArray[np.bool_]


def _item_error(index: int, what: str, error: BatchItemError) -> PalaestraError:
    """The typed error of one failed batch item, its message naming the sub-env."""
    body = {
        "error": {
            "code": error.code,
            "message": f"sub-env {index} could not {what}: {error.message}",
            "retryable": error.retryable,
        }
    }
    after = None if error.retry_after is None else str(error.retry_after)
    return error_from_response(error.status, body, after)


class PalaestraVectorEnv(VectorEnv[Texts, Texts, npt.NDArray[Any]]):
    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP}  # noqa: RUF012  (Gymnasium's)

    def __init__(
        self,
        client: Client,
        tasks: Sequence[str | None],
        *,
        pack: str | None = None,
        split: str | None = None,
        options: dict[str, Any] | None = None,
    ) -> None:
        """One sub-env per entry of `tasks` (None: the server samples from pack/split)."""
        if not tasks:
            raise ValueError("tasks must name at least one task (or None to sample), one a sub-env")
        self.client = client
        self.tasks = list(tasks)
        self.pack = pack
        self.split = split
        self.reset_options = options or {}
        self.num_envs = len(self.tasks)
        self.single_observation_space = AnyText(max_length=MAX_TEXT)
        self.single_action_space = AnyText(max_length=MAX_TEXT)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.episode_ids: list[str | None] = [None] * self.num_envs
        self._obs: list[str] = [""] * self.num_envs

    def reset(
        self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Texts, dict[str, Any]]:
        """Start a new episode in every sub-env (or those `options["reset_mask"]` selects),
        closing the ones they had. `seed`: an int seeds sub-env i with seed + i."""
        options = dict(options or {})
        mask = options.pop("reset_mask", None)
        if mask is None:
            mask = np.ones(self.num_envs, dtype=np.bool_)
        elif not (isinstance(mask, np.ndarray) and mask.dtype == np.bool_ and mask.any()):
            raise ValueError("options['reset_mask'] must be a numpy bool array with a True")
        elif mask.shape != (self.num_envs,):
            raise ValueError(f"options['reset_mask'] must have shape ({self.num_envs},)")
        if isinstance(seed, int):
            super().reset(seed=seed)
            seeds: list[int | None] = [seed + i for i in range(self.num_envs)]
        else:
            seeds = list(seed) if seed is not None else [None] * self.num_envs
        if len(seeds) != self.num_envs:
            raise ValueError(f"seed: a list of {self.num_envs} seeds, got {len(seeds)}")
        chosen = [int(i) for i in np.flatnonzero(mask)]
        self._close([i for i in chosen if self.episode_ids[i] is not None])
        infos: dict[str, Any] = {}
        for i, info in zip(chosen, self._start(chosen, seeds, options), strict=True):
            infos = self._add_info(infos, info, i)
        return tuple(self._obs), infos

    def step(
        self, actions: Texts
    ) -> tuple[Texts, npt.NDArray[np.float64], Bools, Bools, dict[str, Any]]:
        """Step every sub-env with its action in one batch call; ended ones start again."""
        if any(e is None for e in self.episode_ids):
            raise RuntimeError("call reset() before step()")
        actions = tuple(actions)
        if len(actions) != self.num_envs:
            raise ValueError(f"actions: one per sub-env ({self.num_envs}), got {len(actions)}")
        replies: list[StepResponse | None] = [None] * self.num_envs
        invalid: dict[int, str] = {}
        items: list[tuple[int, BatchStepItem]] = []
        for i, action in enumerate(actions):
            try:
                parsed = parse_action(action)
            except ValueError as exc:
                invalid[i] = str(exc)
                continue
            item = BatchStepItem.model_validate(
                {"episode_id": self.episode_ids[i], "action": parsed}
            )
            items.append((i, item))
        if items:
            results = self.client.batch_step([item for _, item in items])
            for (i, _), result in zip(items, results, strict=True):
                if result.error is not None and result.error.status == 422:
                    invalid[i] = result.error.message
                elif result.error is not None:
                    self.episode_ids[i] = None
                    raise _item_error(i, "step its episode", result.error)
                replies[i] = result.result
        rewards = np.zeros(self.num_envs, dtype=np.float64)
        terminated = np.zeros(self.num_envs, dtype=np.bool_)
        truncated = np.zeros(self.num_envs, dtype=np.bool_)
        infos: dict[str, Any] = {}
        step_infos: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        for i, reply in enumerate(replies):
            if reply is None:
                self._obs[i] = invalid_observation(invalid[i])
                step_infos[i] = {"invalid_action": True}
                continue
            self._obs[i] = reply.observation.text
            rewards[i] = reply.reward
            terminated[i], truncated[i] = reply.terminated, reply.truncated
            step_infos[i] = dict(reply.info)
        done = [int(i) for i in np.flatnonzero(terminated | truncated)]
        for i in done:
            final = {"final_obs": self._obs[i], "final_info": step_infos[i]}
            infos = self._add_info(infos, final, i)
            self.episode_ids[i] = None
        if done:
            started = self._start(done, [None] * self.num_envs, {})
            for i, info in zip(done, started, strict=True):
                step_infos[i] = info
        for i, info in enumerate(step_infos):
            infos = self._add_info(infos, info, i)
        return tuple(self._obs), rewards, terminated, truncated, infos

    def _start(
        self, indices: list[int], seeds: list[int | None], options: dict[str, Any]
    ) -> list[dict[str, Any]]:
        """Start the episodes of sub-envs `indices` in one batch reset; their reset infos.

        When one cannot start, the others of this call are closed and its error raised."""
        requests = [
            ResetRequest(
                task=self.tasks[i],
                pack=self.pack,
                split=self.split,
                seed=seeds[i],
                options={**self.reset_options, **options},
            )
            for i in indices
        ]
        results = self.client.batch_reset(requests)
        failed = [(i, r.error) for i, r in zip(indices, results, strict=True) if r.error]
        if failed:
            self._close_episodes([r.result.episode_id for r in results if r.result is not None])
            index, error = failed[0]
            what = f"start an episode of {self.tasks[index] or 'the sampler'}"
            raise _item_error(index, what, error)
        infos = []
        for i, result in zip(indices, results, strict=True):
            assert result.result is not None
            self.episode_ids[i] = result.result.episode_id
            self._obs[i] = result.result.observation.text
            infos.append(reset_info(result.result))
        return infos

    def _close_episodes(self, episode_ids: list[str]) -> None:
        for episode_id in episode_ids:  # closing an ended episode is fine
            self.client.close(episode_id)

    def _close(self, indices: list[int]) -> None:
        ids = [self.episode_ids[i] for i in indices]
        for i in indices:
            self.episode_ids[i] = None
        self._close_episodes([e for e in ids if e is not None])

    def close_extras(self, **kwargs: Any) -> None:
        """Close every sub-env's episode."""
        self._close(list(range(self.num_envs)))
