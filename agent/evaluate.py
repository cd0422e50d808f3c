"""Evaluate a policy over whole episodes of a separate environment."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import gymnasium as gym
import numpy as np

from envs import episode_seed

__all__ = ["EVAL_STREAM", "EvalResult", "run_episodes"]

# Seed stream of evaluation episodes: disjoint from the training envs' (stream 0).
EVAL_STREAM = 1


@dataclass(frozen=True)
class EvalResult:
    returns: np.ndarray  # (episodes,) float64
    lengths: np.ndarray  # (episodes,) int64

    @property
    def mean(self) -> float:
        return float(self.returns.mean())

    @property
    def std(self) -> float:
        return float(self.returns.std())


def run_episodes(
    policy: Callable[[np.ndarray], np.ndarray],
    env: gym.Env,
    episodes: int,
    *,
    seed: int,
    round_index: int = 0,
    stream: int = EVAL_STREAM,
) -> EvalResult:
    """Play ``episodes`` full episodes of ``env`` with ``policy`` (batch of 1 in, actions out).

    Episode ``k`` of evaluation round ``round_index`` is reset with its own seed,
    so an evaluation is reproducible and independent of training's envs
    (stream 0). Periodic evaluations during training use stream 1; ``run.py
    --eval`` uses stream 2, episodes the agent was never selected on.
    """
    returns = np.zeros(episodes, dtype=np.float64)
    lengths = np.zeros(episodes, dtype=np.int64)
    for k in range(episodes):
        obs, _ = env.reset(seed=episode_seed(seed, round_index, k, stream=stream))
        done = False
        while not done:
            action = int(policy(obs[None])[0])
            obs, reward, terminated, truncated, _ = env.step(action)
            returns[k] += float(reward)
            lengths[k] += 1
            done = terminated or truncated
    return EvalResult(returns, lengths)
