"""Atari vector envs stepped by ale-py's own ``AtariVectorEnv`` (``vector: ale``).

``ale_py.vector_env.AtariVectorEnv`` steps every copy of the game in C++ threads with
the DQN preprocessing built in. :class:`AleVectorEnv` sets it up as the gymnasium
pipeline of :func:`envs.make.make_atari` is set up, and gives it the interface the
training loop and the evaluation expect of a vector env:

* the same preprocessing: up to 30 no-ops at reset, frame skip 4 with a max over the
  last two frames, 84x84 grey frames, 4 stacked oldest first; no FIRE at reset, raw
  rewards, whole games (reward clipping and terminal-on-life-loss stay training-only,
  in the loop), sticky actions and the frame cap as the id (or ``env_kwargs``) sets them;
* the stack of a new episode padded with its first frame, as ``FrameStackObservation``
  pads it (``AtariVectorEnv`` pads with zeros): with no-ops off, the frames are the
  gymnasium pipeline's to the bit;
* the caller resets ended copies itself (``reset_mask``, one seed per copy) and every
  step returns the true final observation. ``AtariVectorEnv`` has no disabled autoreset;
  in its next-step mode a copy that ended is reset by the caller before its next step,
  so the autoreset never fires.

An episode is a pure function of its seed and its actions here too, but not the same
function as in the gymnasium pipeline: the ALE draws its no-ops from its own generator.
The copies cannot be stepped one by one, so a resumed run starts its interrupted
episodes afresh, as with ``vector: async``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from agent.errors import UserError

__all__ = ["ALE_OPTIONS", "AleVectorEnv"]

# env_kwargs that AtariVectorEnv takes under the same name. obs_type is accepted and
# ignored: both pipelines read the grey screen themselves.
ALE_OPTIONS = ("repeat_action_probability", "max_num_frames_per_episode", "full_action_space")
_IGNORED = ("obs_type",)
# The seeds an ALE reset takes: non-negative 32-bit integers.
_SEED_RANGE = 2**31


class AleVectorEnv(gym.vector.VectorEnv):
    """``num_envs`` copies of the ALE game ``env_id`` in one ``AtariVectorEnv``.

    Args:
        env_id: a registered ALE id (``BreakoutNoFrameskip-v4``, ``ALE/Breakout-v5``).
        num_envs: copies stepped together.
        env_kwargs: the run's ``env_kwargs``; the keys of :data:`ALE_OPTIONS` override the
            id's own values, any other key is a :class:`UserError`.
        frame_skip, screen_size, frame_stack, noop_max: the DQN preprocessing
            (:mod:`envs.make`'s constants).
        num_threads: threads stepping the copies; ``None``: one per copy, at most one
            per core this process may run on.
    """

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        env_kwargs: Mapping[str, Any] | None = None,
        *,
        frame_skip: int,
        screen_size: int,
        frame_stack: int,
        noop_max: int,
        num_threads: int | None = None,
    ) -> None:
        import ale_py
        from ale_py.vector_env import AtariVectorEnv

        ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)  # as ale-py's AtariEnv
        spec = gym.spec(env_id.rpartition(":")[2])
        user = dict(env_kwargs or {})
        for key in user:
            if key == "frameskip":
                raise UserError(
                    "env_kwargs cannot set frameskip for Atari ids: the DQN preprocessing "
                    f"skips {frame_skip} frames itself; remove it from env_kwargs"
                )
            if key not in ALE_OPTIONS and key not in _IGNORED:
                raise UserError(
                    f"vector=ale has no equivalent of env_kwargs key {key!r} (AtariVectorEnv "
                    f"takes {', '.join(ALE_OPTIONS)}): remove it, or --set vector=async"
                )
        options = {k: v for k, v in {**spec.kwargs, **user}.items() if k in ALE_OPTIONS}
        if spec.max_episode_steps is not None:
            # The id's TimeLimit counts the steps of its frameskip-1 env: emulator frames.
            cap = options.get("max_num_frames_per_episode", spec.max_episode_steps)
            options["max_num_frames_per_episode"] = min(cap, spec.max_episode_steps)
        if num_threads is None:
            num_threads = min(num_envs, len(os.sched_getaffinity(0)))
        self.ale = AtariVectorEnv(
            spec.kwargs["game"], num_envs, num_threads=num_threads,
            autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP,
            img_height=screen_size, img_width=screen_size, grayscale=True,
            stack_num=frame_stack, frameskip=frame_skip, maxpool=True, noop_max=noop_max,
            episodic_life=False, reward_clipping=False, use_fire_reset=False, **options,
        )  # fmt: skip
        self.num_envs = num_envs
        self.single_observation_space = self.ale.single_observation_space
        self.single_action_space = self.ale.single_action_space
        self.observation_space = self.ale.observation_space
        self.action_space = self.ale.action_space
        self.metadata = {"autoreset_mode": gym.vector.AutoresetMode.DISABLED}
        self.spec = spec
        # Agent steps since each copy's reset: the stack holds zeros below the first frame
        # until frame_stack - 1 steps have passed.
        self._since_reset = np.zeros(num_envs, dtype=np.int64)

    def reset(
        self,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Reset every copy, or those of ``options["reset_mask"]``; ``seed``: one seed (the
        copies get ``seed``, ``seed + 1``, ...), or one per copy (``None``: unseeded)."""
        mask = None if options is None else options.get("reset_mask")
        indices = np.arange(self.num_envs) if mask is None else np.flatnonzero(mask)
        if seed is None:
            seeds = [None] * len(indices)
        elif isinstance(seed, (int, np.integer)):
            seeds = [int(seed) + k for k in range(len(indices))]
        else:
            seeds = [seed[i] for i in indices]
        ale_seeds = np.array([-1 if s is None else int(s) % _SEED_RANGE for s in seeds],
                             dtype=np.int64)  # fmt: skip
        reset_mask = np.zeros(self.num_envs, dtype=bool)
        reset_mask[indices] = True
        obs, info = self.ale.reset(seed=ale_seeds, options={"reset_mask": reset_mask})
        self._since_reset[indices] = 0
        return self._padded(obs), info

    def step(
        self, actions: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        obs, rewards, terminated, truncated, info = self.ale.step(
            np.asarray(actions, dtype=np.int64)
        )
        self._since_reset += 1
        return (self._padded(obs), rewards.astype(np.float64), terminated.astype(bool),
                truncated.astype(bool), info)  # fmt: skip

    def _padded(self, obs: np.ndarray) -> np.ndarray:
        """``obs`` with each young stack's zero frames replaced by its episode's first frame."""
        stack = obs.shape[1]
        for i in np.flatnonzero(self._since_reset < stack - 1):
            first = stack - 1 - int(self._since_reset[i])  # where the first frame sits
            obs[i, :first] = obs[i, first]
        return obs

    def close_extras(self, **kwargs: Any) -> None:
        self.ale.close()
