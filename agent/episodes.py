"""Episode bookkeeping of the training envs: returns, lengths, seeds, lives, and exact resume.

Not the algorithm, so it lives beside the training loop rather than inside it. The
vector env runs with autoreset disabled (``envs/make.py``): this object resets an
ended sub-env itself, with the seed of that env's next episode, so an episode is a
pure function of its seed and its actions. It keeps each current episode's actions,
which is what lets a resumed run rebuild the environments exactly.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from envs import episode_seed

__all__ = ["Episodes"]


class Episodes:
    """Per sub-env episode number, return, length, actions so far and lives (Atari).

    Args:
        num_envs: sub-environments of the vector env.
        seed: the run's seed; episode ``k`` of env ``i`` is reset with
            ``episode_seed(seed, i, k)``.
        watch_repeats: keep each current episode's observations (a CRC-32 of their
            bytes) for :meth:`observe`.
    """

    def __init__(self, num_envs: int, seed: int, *, watch_repeats: bool = False) -> None:
        self.num_envs = num_envs
        self.seed = seed
        self.watch_repeats = watch_repeats
        self.seen: list[set[int]] = [set() for _ in range(num_envs)]
        self.index = np.zeros(num_envs, dtype=np.int64)  # episode number of each env
        self.returns = np.zeros(num_envs, dtype=np.float64)
        self.lengths = np.zeros(num_envs, dtype=np.int64)
        self.actions: list[list[int]] = [[] for _ in range(num_envs)]
        self.lives: np.ndarray | None = None  # info["lives"] of each env, where reported

    def _seeds(self, mask: np.ndarray | None = None) -> list[int | None]:
        return [
            episode_seed(self.seed, i, int(self.index[i])) if mask is None or mask[i] else None
            for i in range(self.num_envs)
        ]

    def reset(self, envs: Any) -> np.ndarray:
        """Start the current episode of every env; returns the first observations."""
        obs, info = envs.reset(seed=self._seeds())
        self.lives = _lives(info, None)
        self.seen = [set() for _ in range(self.num_envs)]
        self.observe(obs)
        return obs

    def observe(self, obs: np.ndarray) -> bool:
        """Record every env's observation in its current episode; True if one of them was
        seen before in that episode (always False unless ``watch_repeats``)."""
        if not self.watch_repeats:
            return False
        repeated = False
        for seen, o in zip(self.seen, obs, strict=True):
            key = _key(o)
            repeated |= key in seen
            seen.add(key)
        return repeated

    def step(self, actions: np.ndarray, rewards: np.ndarray, info: dict[str, Any]) -> np.ndarray:
        """Record one vector step; returns where a life was lost (all False without lives)."""
        self.returns += rewards
        self.lengths += 1
        for i, a in enumerate(actions.tolist()):
            self.actions[i].append(a)
        if self.lives is None:
            return np.zeros(self.num_envs, dtype=bool)
        new_lives = _lives(info, self.lives)
        assert new_lives is not None
        lost = new_lives < self.lives
        self.lives = new_lives
        return lost

    def finish(self, envs: Any, done: np.ndarray) -> tuple[np.ndarray, list[tuple[float, int]]]:
        """End the episodes where ``done``, reset those envs with their next seeds.

        Returns the observations of every env after the resets (the vector env gives
        the current observation of the envs it did not reset) and the
        ``(return, length)`` of every finished episode, in env order.
        """
        finished = []
        for i in np.flatnonzero(done):
            finished.append((float(self.returns[i]), int(self.lengths[i])))
            self.index[i] += 1
            self.returns[i], self.lengths[i], self.actions[i] = 0.0, 0, []
            self.seen[i] = set()  # the caller observes the new episode's first observation
        obs, info = envs.reset(seed=self._seeds(done), options={"reset_mask": done})
        self.lives = _lives(info, self.lives)
        return obs, finished

    # -- checkpoints --------------------------------------------------------- #

    def state_dict(self, obs: np.ndarray) -> dict[str, Any]:
        """Tensors only (``weights_only`` loads); ``obs`` checks a replay on resume."""
        state: dict[str, Any] = {
            "ep_index": torch.from_numpy(self.index.copy()),
            "ep_actions": [torch.tensor(a, dtype=torch.int64) for a in self.actions],
            "obs": torch.from_numpy(np.asarray(obs).copy()),
        }
        if self.lives is not None:
            state["lives"] = torch.from_numpy(self.lives.copy())
        return state

    def restore(self, envs: Any, state: dict[str, Any], echo: Callable[[str], Any]) -> np.ndarray:
        """Rebuild the saved episodes by replaying their seeds and actions; returns the obs.

        Needs direct access to the sub-envs (a sync vector env) and deterministic envs.
        Where the replayed observations differ from the saved ones (an async vector
        env, a non-deterministic env), the interrupted episodes are dropped, new ones
        start, and ``echo`` says so.
        """
        self.index = state["ep_index"].numpy().copy()
        actions = [t.tolist() for t in state["ep_actions"]]
        saved_obs = state["obs"].numpy()
        if hasattr(envs, "envs"):
            obs = self._replay(envs, actions)
            if np.array_equal(obs, saved_obs):
                self.actions = actions
                if "lives" in state:
                    self.lives = state["lives"].numpy().copy()
                return obs
        echo(
            "note: the environments could not be restored exactly (async vector env or a "
            "non-deterministic env); resumed episodes start afresh"
        )
        self.index += 1
        self.returns[:], self.lengths[:] = 0.0, 0
        self.actions = [[] for _ in range(self.num_envs)]
        return self.reset(envs)

    def _replay(self, envs: Any, actions: list[list[int]]) -> np.ndarray:
        obs = self.reset(envs)
        for i, episode_actions in enumerate(actions):
            sub_env = envs.envs[i]
            for a in episode_actions:
                o, r, _, _, _ = sub_env.step(a)
                self.returns[i] += float(r)
                obs[i] = o
                if self.watch_repeats:  # the episode's observations, as the run saw them
                    self.seen[i].add(_key(o))
        self.lengths = np.array([len(a) for a in actions], dtype=np.int64)
        return obs


def _key(obs: np.ndarray) -> int:
    """An observation's key for :meth:`Episodes.observe`: a CRC-32 of its bytes."""
    return zlib.crc32(np.ascontiguousarray(obs).data)


def _lives(info: dict[str, Any], previous: np.ndarray | None) -> np.ndarray | None:
    """``info["lives"]`` of a vector env step or reset, kept from ``previous`` where masked out."""
    if "lives" not in info:
        return previous
    lives = np.asarray(info["lives"], dtype=np.int64)
    if previous is None:
        return lives.copy()
    mask = np.asarray(info.get("_lives", np.ones(len(lives), dtype=bool)), dtype=bool)
    return np.where(mask, lives, previous)
