"""Tiny deterministic environments for tests: episodes end at known steps.

Importing this module registers:

* ``NoisyDQN/Cue-v0``: each step shows a cue (+1 or -1) and pays 1 for the
  matching action (1 for +1, 0 for -1). The episode *terminates* after
  ``length`` steps (default 5); a ``TimeLimit`` of 100 never fires; its
  reward threshold is 4.5.
* ``NoisyDQN/CueTruncated-v0``: the same with ``length=1000``, cut by a
  ``TimeLimit`` of 7 steps, so every episode is *truncated*.

Observation: ``[cue, steps_left / length]``, float32. The cue is drawn from the
env's seeded ``np_random``, so an episode is a function of its reset seed.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

__all__ = ["CueEnv"]


class CueEnv(gym.Env):
    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012 (gymnasium's convention)

    def __init__(self, length: int = 5, render_mode: str | None = None) -> None:
        self.length = int(length)
        self.render_mode = render_mode
        self.observation_space = gym.spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self._t = 0
        self._cue = 1.0

    def _obs(self) -> np.ndarray:
        return np.array([self._cue, (self.length - self._t) / self.length], dtype=np.float32)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self._t = 0
        self._cue = float(self.np_random.choice([-1.0, 1.0]))
        return self._obs(), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        reward = 1.0 if (int(action) == 1) == (self._cue > 0) else 0.0
        self._t += 1
        self._cue = float(self.np_random.choice([-1.0, 1.0]))
        terminated = self._t >= self.length
        return self._obs(), reward, terminated, False, {}


if "NoisyDQN/Cue-v0" not in gym.registry:
    gym.register(
        "NoisyDQN/Cue-v0", entry_point=CueEnv, max_episode_steps=100, reward_threshold=4.5
    )
    gym.register(
        "NoisyDQN/CueTruncated-v0",
        entry_point=CueEnv,
        kwargs={"length": 1000},
        max_episode_steps=7,
    )
