"""bench/tabular_q.py: the tabular Q-learning reference for the toy-text envs."""

from __future__ import annotations

import numpy as np

from bench.tabular_q import greedy_episodes, q_learning

DETERMINISTIC = {"is_slippery": False}  # FrozenLake 4x4 without slips: the goal is worth 1


def test_q_learning_finds_the_goal_of_a_deterministic_grid():
    q, reached = q_learning(
        "FrozenLake-v1", seed=0, steps=5000, threshold=1.0, eval_interval=250,
        env_kwargs=DETERMINISTIC,
    )
    assert reached is not None and reached <= 5000
    policy = q.argmax(axis=1)
    assert greedy_episodes("FrozenLake-v1", policy, 5, seed=0, env_kwargs=DETERMINISTIC) == 1.0


def test_a_policy_that_never_reaches_the_goal_scores_nothing():
    walk_left = np.zeros(16, dtype=np.int64)  # LEFT everywhere: stuck in the start corner
    assert greedy_episodes("FrozenLake-v1", walk_left, 3, seed=0, env_kwargs=DETERMINISTIC) == 0.0


def test_too_few_steps_reach_nothing():
    _, reached = q_learning(
        "FrozenLake-v1", seed=0, steps=10, threshold=1.0, eval_interval=5,
        env_kwargs=DETERMINISTIC,
    )
    assert reached is None
