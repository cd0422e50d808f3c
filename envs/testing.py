"""Tiny deterministic environments for tests: episodes end at known steps.

Importing this module registers:

* ``NoisyDQN/Cue-v0``: each step shows a cue (+1 or -1) and pays 1 for the
  matching action (1 for +1, 0 for -1). The episode *terminates* after
  ``length`` steps (default 5); a ``TimeLimit`` of 100 never fires; its
  reward threshold is 4.5.
* ``NoisyDQN/CueTruncated-v0``: the same with ``length=1000``, cut by a
  ``TimeLimit`` of 7 steps, so every episode is *truncated*.

* ``NoisyDQN/CueVaried-v0``: each episode's length is drawn (2..9) from the reset
  seed, so sub-environments of a vector env end their episodes at different,
  known steps; it *terminates*.
* ``NoisyDQN/CueVariedTruncated-v0``: the same, but the episode is *truncated*
  (the env sets ``truncated``) at that length.

Observation: ``[cue, steps_left / length]``, float32. The cue is drawn from the
env's seeded ``np_random``, so an episode is a function of its reset seed.

Image test envs (no ale-py needed), observations ``(4, size, size)`` uint8 built by
gymnasium's ``FrameStackObservation`` over :class:`FrameEnv`:

* ``NoisyDQN/Frames-v0`` (36x36, the smallest the Nature CNN takes): episodes of
  3..30 steps (drawn from the reset seed) that terminate, 3 lives (one lost every
  ``life_every`` = 4 steps, reported as ``info["lives"]``), rewards in {-0.5, 2.0}
  (so clipping changes them).
* ``NoisyDQN/FramesTruncated-v0``: the same, truncated instead of terminated.

Observation-space test envs (``envs.make.adapt_observations`` turns their observations
into what the network takes), all :class:`SpaceEnv`: episodes of 5 steps that terminate,
2 actions, reward 1 when the action equals ``step % 2``, and a cue bit drawn from the
reset seed in every observation; ``render_mode="rgb_array"`` gives 8x8 frames (video):

* ``NoisyDQN/MultiDiscrete-v0``: ``MultiDiscrete([3, 2])``, ``[step % 3, cue]``.
* ``NoisyDQN/Tuple-v0``: ``Tuple(Discrete(5), Discrete(2))``, ``(step, cue)``.
* ``NoisyDQN/Grid-v0``: ``Box`` of rank 2, ``(3, 4)`` float32, one 1.0 at ``[step % 3, cue]``.
* ``NoisyDQN/ImageHWC-v0``: a channel-last ``(40, 40, 3)`` uint8 image of random bytes
  with ``[0, 0, :] = (step, cue, 7)``.
* ``NoisyDQN/Text-v0``: ``Text`` observations, which nothing can adapt (an error).

Wrappers for tests (the ``wrappers`` key names them, so they apply in worker processes too):

* :class:`StepLog`: appends ``start PID`` and ``end PID`` around each of an env's first
  ``slow_steps`` steps, which each take ``seconds``, to the file ``path``: the order of
  the lines shows whether envs in different processes stepped at once.

Every frame encodes where it comes from: pixel ``[0, 0]`` is the step in the
episode, ``[0, 1]`` an episode tag drawn at reset, the rest random bytes, so
two frames are equal only by chance (tests compare stacks rebuilt by the frame
replay with the stacks the env returned).
"""

from __future__ import annotations

import os
import time
from typing import Any

import gymnasium as gym
import numpy as np

__all__ = ["SPACE_KINDS", "CueEnv", "FrameEnv", "SpaceEnv", "StepLog", "make_frames_env"]


class CueEnv(gym.Env):
    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012 (gymnasium's convention)

    def __init__(
        self,
        length: int = 5,
        render_mode: str | None = None,
        length_range: tuple[int, int] | None = None,
        truncate: bool = False,
    ) -> None:
        self.length = int(length)
        self.length_range = length_range
        self.truncate = truncate
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
        if self.length_range is not None:
            lo, hi = self.length_range
            self.length = int(self.np_random.integers(lo, hi + 1))
        self._t = 0
        self._cue = float(self.np_random.choice([-1.0, 1.0]))
        return self._obs(), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        reward = 1.0 if (int(action) == 1) == (self._cue > 0) else 0.0
        self._t += 1
        self._cue = float(self.np_random.choice([-1.0, 1.0]))
        ended = self._t >= self.length
        if self.truncate:
            return self._obs(), reward, False, ended, {}
        return self._obs(), reward, ended, False, {}


class FrameEnv(gym.Env):
    """Single uint8 frames ``(size, size)`` that say which step and episode they belong to.

    Episode length is drawn from ``length_range`` at reset; the agent has
    ``lives`` lives and loses one every ``life_every`` steps (never the last one
    before the episode ends); the reward is 2.0 when the action equals
    ``step % n_actions``, else -0.5.
    """

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012 (gymnasium's convention)

    def __init__(
        self,
        size: int = 36,
        length_range: tuple[int, int] = (3, 30),
        lives: int = 3,
        life_every: int = 4,
        truncate: bool = False,
        n_actions: int = 3,
    ) -> None:
        self.size = int(size)
        self.length_range = length_range
        self.lives = int(lives)
        self.life_every = int(life_every)
        self.truncate = truncate
        self.observation_space = gym.spaces.Box(0, 255, shape=(size, size), dtype=np.uint8)
        self.action_space = gym.spaces.Discrete(n_actions)
        self._t = 0
        self._tag = 0
        self._length = 1
        self._lives = self.lives

    def _frame(self) -> np.ndarray:
        frame = self.np_random.integers(0, 256, size=(self.size, self.size), dtype=np.uint8)
        frame[0, 0] = self._t % 256
        frame[0, 1] = self._tag
        return frame

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        lo, hi = self.length_range
        self._length = int(self.np_random.integers(lo, hi + 1))
        self._tag = int(self.np_random.integers(256))
        self._t = 0
        self._lives = self.lives
        return self._frame(), {"lives": self._lives}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        reward = 2.0 if int(action) == self._t % self.action_space.n else -0.5
        self._t += 1
        ended = self._t >= self._length
        if not ended and self._t % self.life_every == 0 and self._lives > 1:
            self._lives -= 1
        info = {"lives": self._lives}
        if self.truncate:
            return self._frame(), reward, False, ended, info
        return self._frame(), reward, ended, False, info


def make_frames_env(stack: int = 4, **kwargs: Any) -> gym.Env:
    """:class:`FrameEnv` under gymnasium's ``FrameStackObservation`` (reset-frame padding)."""
    from gymnasium.wrappers import FrameStackObservation

    return FrameStackObservation(FrameEnv(**kwargs), stack, padding_type="reset")


SPACE_KINDS = ("MultiDiscrete", "Tuple", "Grid", "ImageHWC", "Text")


class SpaceEnv(gym.Env):
    """Five-step episodes whose observations live in the space named by ``kind``.

    ``last_raw`` keeps the last observation as the env returned it (before any
    wrapper), so that tests can check what the adaptation made of it.
    """

    metadata: dict[str, Any] = {"render_modes": ["rgb_array"], "render_fps": 4}  # noqa: RUF012

    def __init__(self, kind: str = "MultiDiscrete", render_mode: str | None = None) -> None:
        if kind not in SPACE_KINDS:
            raise ValueError(f"kind must be one of {SPACE_KINDS}, got {kind!r}")
        self.kind = kind
        self.render_mode = render_mode
        spaces = gym.spaces
        self.observation_space = {
            "MultiDiscrete": spaces.MultiDiscrete([3, 2]),
            "Tuple": spaces.Tuple((spaces.Discrete(5), spaces.Discrete(2))),
            "Grid": spaces.Box(0.0, 1.0, shape=(3, 4), dtype=np.float32),
            "ImageHWC": spaces.Box(0, 255, shape=(40, 40, 3), dtype=np.uint8),
            "Text": spaces.Text(5),
        }[kind]
        self.action_space = gym.spaces.Discrete(2)
        self._t = 0
        self._cue = 0
        self.last_raw: Any = None

    def _obs(self) -> Any:
        t, cue = self._t, self._cue
        if self.kind == "MultiDiscrete":
            obs: Any = np.array([t % 3, cue], dtype=np.int64)
        elif self.kind == "Tuple":
            obs = (t % 5, cue)  # t reaches 5 at the episode end
        elif self.kind == "Grid":
            obs = np.zeros((3, 4), dtype=np.float32)
            obs[t % 3, cue] = 1.0
        elif self.kind == "ImageHWC":
            obs = self.np_random.integers(0, 256, size=(40, 40, 3), dtype=np.uint8)
            obs[0, 0] = (t, cue, 7)
        else:
            obs = "ab"[cue] * (t % 5 + 1)
        self.last_raw = obs
        return obs

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        self._t = 0
        self._cue = int(self.np_random.integers(2))
        return self._obs(), {}

    def step(self, action: int) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        reward = 1.0 if int(action) == self._t % 2 else 0.0
        self._t += 1
        return self._obs(), reward, self._t >= 5, False, {}

    def render(self) -> np.ndarray:
        frame = np.zeros((8, 8, 3), dtype=np.uint8)
        frame[self._t % 8, :, self._cue] = 255
        return frame


class StepLog(gym.Wrapper):
    """Logs ``start PID`` / ``end PID`` around each of the env's first ``slow_steps``
    steps to ``path``, each step held for ``seconds``; one ``O_APPEND`` write a line, so
    lines from several processes do not mix."""

    def __init__(
        self, env: gym.Env, path: str, slow_steps: int = 3, seconds: float = 0.2
    ) -> None:
        super().__init__(env)
        self.path, self.slow_steps, self.seconds = path, slow_steps, seconds
        self._steps = 0

    def _log(self, what: str) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, f"{what} {os.getpid()}\n".encode())
        finally:
            os.close(fd)

    def step(self, action: Any) -> Any:
        slow = self._steps < self.slow_steps
        self._steps += 1
        if slow:
            self._log("start")
            time.sleep(self.seconds)
        out = self.env.step(action)
        if slow:
            self._log("end")
        return out


if "NoisyDQN/Cue-v0" not in gym.registry:
    for _kind in SPACE_KINDS:
        gym.register(
            f"NoisyDQN/{_kind}-v0",
            entry_point=SpaceEnv,
            kwargs={"kind": _kind},
            max_episode_steps=100,
            reward_threshold=4.5,
        )
    gym.register(
        "NoisyDQN/Cue-v0", entry_point=CueEnv, max_episode_steps=100, reward_threshold=4.5
    )
    gym.register(
        "NoisyDQN/CueTruncated-v0",
        entry_point=CueEnv,
        kwargs={"length": 1000},
        max_episode_steps=7,
    )
    gym.register(
        "NoisyDQN/CueVaried-v0",
        entry_point=CueEnv,
        kwargs={"length_range": (2, 9)},
        max_episode_steps=100,
    )
    gym.register(
        "NoisyDQN/CueVariedTruncated-v0",
        entry_point=CueEnv,
        kwargs={"length_range": (2, 9), "truncate": True},
        max_episode_steps=100,
    )
    gym.register("NoisyDQN/Frames-v0", entry_point=make_frames_env)
    gym.register(
        "NoisyDQN/FramesTruncated-v0", entry_point=make_frames_env, kwargs={"truncate": True}
    )
