"""n-step returns: the window of the last ``n_step`` steps of every env, shared by both
replay buffers (:mod:`agent.replay.flat`, :mod:`agent.replay.frames`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

__all__ = ["NStepWindows"]

Emit = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray, Any, Any], None]


class NStepWindows:
    """Per-env windows of the last ``n_step`` steps, turned into finished transitions.

    Every :meth:`push` carries one step of each of ``num_envs`` envs, so step ``t`` sits
    in slot ``t % n_step`` for all of them. A window holding ``n_step`` steps finishes its
    oldest step's transition (the k-step return, ``next_obs`` of the newest step, done =
    its ``terminated``, discount gamma**n). An episode end (terminated or truncated)
    flushes the shorter windows left; a step whose action was a random one (``explored``)
    flushes them before it, bootstrapping from its ``obs``, so that no return carries an
    action the policy would not take (as Watkins's Q(lambda) cuts its traces).

    Finished transitions go to ``emit(obs, actions, returns, next_obs, dones,
    discounts)``: arrays of m rows, or scalars that broadcast. ``obs`` is whatever a
    buffer keeps per step (``obs_shape``, ``obs_dtype``): observations, or frame indices.
    """

    def __init__(
        self,
        num_envs: int,
        n_step: int,
        gamma: float,
        obs_shape: tuple[int, ...],
        obs_dtype: np.dtype,
        emit: Emit,
    ) -> None:
        self.num_envs, self.n_step, self.gamma, self.emit = num_envs, n_step, gamma, emit
        self.obs_shape = tuple(obs_shape)
        self.t = 0  # steps pushed
        self.obs = np.zeros((num_envs, n_step, *obs_shape), dtype=obs_dtype)
        self.actions = np.zeros((num_envs, n_step), dtype=np.int64)
        self.rewards = np.zeros((num_envs, n_step), dtype=np.float64)
        # The step at which each env's current episode began; _last_start is its maximum
        # as a Python int, so the steady state needs no array test.
        self.episode_start = np.zeros(num_envs, dtype=np.int64)
        self._last_start = 0
        pows = self.gamma ** np.arange(n_step + 1, dtype=np.float64)
        self.gamma_pows = pows  # gamma**k, k = 0..n_step
        # _ret_weights[s] @ window rewards = the n-step return of the window whose newest
        # step sits in slot s (so its oldest in slot (s + 1) % n).
        slots = np.arange(n_step)
        self._ret_weights = np.stack([pows[(slots - (s + 1)) % n_step] for s in range(n_step)])

    def push(
        self,
        obs: np.ndarray,
        actions: np.ndarray,
        rewards: np.ndarray,
        next_obs: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        explored: np.ndarray | None = None,
    ) -> None:
        """One step of every env (leading dimension ``num_envs``; bool ``terminated``,
        ``truncated`` and ``explored``, or None for no random action)."""
        if self.n_step == 1:  # every step is its own transition
            self.emit(obs, actions, rewards, next_obs, terminated, self.gamma)
            return
        if explored is not None:
            self._cut(obs, explored)
        n = self.n_step
        s = self.t % n  # window slot of this step, the same for every env
        self.t += 1
        self.obs[:, s] = obs
        self.actions[:, s] = actions
        self.rewards[:, s] = rewards

        # Windows holding n steps finish their oldest transition (started n-1 steps ago,
        # in slot (s + 1) % n). With terminated set it is also the longest window of an
        # ending episode, so dones=terminated is right for it.
        oldest = (s + 1) % n
        if self.t - self._last_start >= n:  # every env's episode is >= n steps long
            n_full = self.num_envs
        else:
            full = self.episode_start <= self.t - n  # (E,) episode length >= n
            n_full = np.count_nonzero(full)  # (count_nonzero: ~3x cheaper than any/all)
        if n_full == self.num_envs:
            returns = self.rewards @ self._ret_weights[s]  # (E,)
            self.emit(self.obs[:, oldest], self.actions[:, oldest], returns, next_obs,
                      terminated, self.gamma_pows[n])  # fmt: skip
        elif n_full:
            envs = full.nonzero()[0]
            returns = self.rewards[envs] @ self._ret_weights[s]
            self.emit(self.obs[envs, oldest], self.actions[envs, oldest], returns,
                      next_obs[envs], terminated[envs], self.gamma_pows[n])  # fmt: skip

        # An episode end flushes the shorter windows left (rare: a loop is cheap).
        ended = terminated | truncated
        if np.count_nonzero(ended):
            for env in ended.nonzero()[0]:
                self._flush(int(env), s, next_obs[env], bool(terminated[env]))
            self._last_start = self.t

    def _cut(self, obs: np.ndarray, explored: np.ndarray) -> None:
        """End the pending windows of the explored envs before this step, at ``obs``."""
        last = (self.t - 1) % self.n_step  # the slot of the previous step
        for env in explored.nonzero()[0]:
            self._flush(int(env), last, obs[env], terminated=False)
        self._last_start = self.t  # their next windows start with this step

    def _flush(self, env: int, s: int, final_obs: np.ndarray, terminated: bool) -> None:
        """Emit env's pending windows shorter than n, which end at the step in slot s."""
        n = self.n_step
        m = min(self.t - int(self.episode_start[env]), n - 1)  # a full one was emitted
        self.episode_start[env] = self.t  # the next episode starts with the next step
        if m == 0:
            return
        # The window started j steps ago (j = 0..m-1) covers k = j + 1 steps:
        # G_j = r[s - j] + gamma * G_{j-1}, built from the newest step backwards.
        rewards = self.rewards[env]
        returns = np.empty(m, dtype=np.float64)
        g = 0.0
        for j in range(m):
            g = rewards[(s - j) % n] + self.gamma * g
            returns[j] = g
        slots = (s - np.arange(m)) % n
        self.emit(self.obs[env, slots], self.actions[env, slots], returns,
                  np.broadcast_to(final_obs, (m, *self.obs_shape)), terminated,
                  self.gamma_pows[1 : m + 1])  # fmt: skip

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """The pending windows, for an exact resume (plain tensors and numbers)."""
        return {
            "t": self.t,
            "window_obs": torch.from_numpy(self.obs.copy()),
            "window_actions": torch.from_numpy(self.actions.copy()),
            "window_rewards": torch.from_numpy(self.rewards.copy()),
            "episode_steps": torch.from_numpy(self.t - self.episode_start),
        }

    def check_state(self, state: dict[str, Any]) -> None:
        """Raise ``ValueError`` unless ``state`` fits these windows."""
        arrays = {"window_obs": self.obs, "window_actions": self.actions,
                  "window_rewards": self.rewards, "episode_steps": self.episode_start}
        for name, arr in arrays.items():
            if name not in state or tuple(state[name].shape) != arr.shape:
                got = tuple(state[name].shape) if name in state else "missing"
                raise ValueError(f"replay state_dict: {name} is {got}, expected {arr.shape}")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.check_state(state)
        self.t = int(state["t"])
        self.obs[...] = state["window_obs"].cpu().numpy()
        self.actions[...] = state["window_actions"].cpu().numpy()
        self.rewards[...] = state["window_rewards"].cpu().numpy()
        # Saved as episode lengths, kept as start steps.
        self.episode_start[:] = self.t - state["episode_steps"].cpu().numpy()
        self._last_start = int(self.episode_start.max())
