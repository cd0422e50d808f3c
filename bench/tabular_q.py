"""Tabular Q-learning on a toy-text env: the reference a one-hot DQN is measured against.

    python -m bench.tabular_q --env Taxi-v4 --seeds 201-210 --steps 200000

Watkins's Q-learning on the env's integer states, in a few lines: a table that starts
at 0, epsilon-greedy acting (epsilon 0.1, ties broken at random), step size 0.1, gamma
0.99, and a time-limit truncation bootstrapped as our agents bootstrap it. Every
``--eval-interval`` steps the greedy policy is valued exactly (``bench.exact_value``'s
dynamic programming over the env's transition table and time limit), so "steps to reach"
carries no sampling noise. Per seed: the first step at which the greedy policy's exact
value reached ``--threshold``, the final exact value, and the final greedy policy's mean
over 100 seeded episodes (noise-free, like our agents' final evaluation).
"""

from __future__ import annotations

import argparse
import statistics
import sys

import gymnasium as gym
import numpy as np

from bench.cartpole import parse_seeds
from bench.exact_value import TabularModel, expected_return

__all__ = ["greedy_episodes", "q_learning"]


def q_learning(
    env_id: str,
    seed: int,
    steps: int,
    *,
    epsilon: float = 0.1,
    alpha: float = 0.1,
    gamma: float = 0.99,
    eval_interval: int = 2000,
    threshold: float | None = None,
    env_kwargs: dict | None = None,
) -> tuple[np.ndarray, int | None]:
    """(the Q table after ``steps`` env steps, the first step whose greedy policy was worth
    ``threshold`` or more exactly; None if never or no threshold)."""
    env = gym.make(env_id, **(env_kwargs or {}))
    model = TabularModel(env)
    horizon = env.spec.max_episode_steps
    rng = np.random.default_rng(seed)
    q = np.zeros((model.n_states, model.n_actions))
    state, _ = env.reset(seed=seed)
    reached = None
    for step in range(1, steps + 1):
        best = np.flatnonzero(q[state] == q[state].max())
        action = int(rng.integers(model.n_actions) if rng.random() < epsilon else rng.choice(best))
        next_state, reward, terminated, truncated, _ = env.step(action)
        target = reward + (0.0 if terminated else gamma * q[next_state].max())
        q[state, action] += alpha * (target - q[state, action])
        state = next_state
        if terminated or truncated:
            state, _ = env.reset()
        if threshold is not None and reached is None and step % eval_interval == 0:
            if expected_return(model, q.argmax(axis=1), horizon) >= threshold:
                reached = step
    env.close()
    return q, reached


def greedy_episodes(
    env_id: str, policy: np.ndarray, episodes: int, seed: int, env_kwargs: dict | None = None
) -> float:
    """Mean return of ``policy`` (an action per state) over ``episodes`` seeded episodes."""
    env = gym.make(env_id, **(env_kwargs or {}))
    returns = []
    for episode in range(episodes):
        state, _ = env.reset(seed=seed + episode)
        total, done = 0.0, False
        while not done:
            state, reward, terminated, truncated, _ = env.step(int(policy[state]))
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return statistics.fmean(returns)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--env", default="Taxi-v4", help="a toy-text env with a transition table")
    p.add_argument("--seeds", default="201-210", help="a range (201-210) or a list (1,2,3)")
    p.add_argument("--steps", type=int, default=200_000, help="env steps per seed")
    p.add_argument("--threshold", type=float, default=7.0, help="exact value counted as reached")
    p.add_argument("--eval-interval", type=int, default=2000, help="steps between exact values")
    args = p.parse_args(argv)
    env = gym.make(args.env)
    model, horizon = TabularModel(env), env.spec.max_episode_steps
    env.close()
    finals, reached_at = [], []
    print(f"tabular Q-learning on {args.env}, {args.steps:,} steps, epsilon 0.1, alpha 0.1")
    for seed in parse_seeds(args.seeds):
        q, reached = q_learning(args.env, seed, args.steps, eval_interval=args.eval_interval,
                                threshold=args.threshold)  # fmt: skip
        policy = q.argmax(axis=1)
        value = expected_return(model, policy, horizon)
        mean100 = greedy_episodes(args.env, policy, 100, seed=10_000 * seed)
        finals.append(mean100)
        reached_at.append(reached)
        when = "never" if reached is None else f"{reached:,}"
        print(f"seed {seed}: exact value {value:.3f}, 100-episode mean {mean100:.2f}, "
              f"exact value >= {args.threshold} from step {when}")
    hits = [r for r in reached_at if r is not None]
    median = f"{statistics.median(hits):,.0f}" if hits else "-"
    solved = sum(f >= args.threshold for f in finals)
    print(f"100-episode mean >= {args.threshold}: {solved}/{len(finals)}; "
          f"median step reaching it (exact, of those that did): {median}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
